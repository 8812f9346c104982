// Package ordersapi is the example order service: it places, cancels and
// reads orders, and records an OrderCreated or OrderCancelled event with
// outbox.Writer (or, with Config.Writer WriterSQL, a plain SQL call of the
// outbox's enqueue function) in the same PostgreSQL transaction as the order
// rows. Handler
// serves it over HTTP.
//
// A command either commits its rows and its event together or leaves nothing
// behind: an order naming an unknown SKU fails on the order_items foreign key
// after the order row and its event were written, and the whole transaction
// rolls back (the demo and the tests use this to show invariant I2).
//
// Failpoints: "order/before-commit" fires just before a command's commit (an
// injected error rolls it back), "order/after-commit-before-response" just
// after it (an injected error makes the response a 500 although the command
// committed, as a lost response would).
package ordersapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersdb"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// Limits on a request.
const (
	// MaxItems is the most items an order may have.
	MaxItems = 100
	// MaxQuantity is the largest quantity of one item.
	MaxQuantity = 10000
	// MaxIDLength bounds customer ids, SKUs and order ids.
	MaxIDLength = 128
	// MaxKeyLength bounds the Idempotency-Key header.
	MaxKeyLength = 255
)

// Order statuses.
const (
	StatusCreated   = "created"
	StatusConfirmed = "confirmed"
	StatusCancelled = "cancelled"
)

// Failpoint names.
const (
	FailpointBeforeCommit              = "order/before-commit"
	FailpointAfterCommitBeforeResponse = "order/after-commit-before-response"
)

// Item is one order line.
type Item = orderevents.Item

// CreateRequest is the body of POST /orders.
type CreateRequest struct {
	CustomerID string `json:"customer_id"`
	Items      []Item `json:"items"`
}

// Order is an order as the API returns it.
type Order struct {
	ID          string     `json:"id"`
	CustomerID  string     `json:"customer_id"`
	Status      string     `json:"status"`
	Items       []Item     `json:"items"`
	CreatedAt   time.Time  `json:"created_at"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
	// CancelReason says why the order was cancelled ("customer", or the
	// saga's reason).
	CancelReason string `json:"cancel_reason,omitempty"`
	// TotalCents is the order's amount (catalogue prices times quantities).
	TotalCents int64 `json:"total_cents"`
	// Saga is the order's saga: its state and history (docs/saga.md).
	Saga *Saga `json:"saga,omitempty"`
}

// ErrorKind classifies the errors the service returns for requests it refuses.
type ErrorKind int

// Error kinds. Each maps to an HTTP status and an RFC 9457 problem type.
const (
	// Invalid: the request breaks a validation rule (422).
	Invalid ErrorKind = iota + 1
	// UnknownSKU: an item names a SKU that is not in the catalogue; the
	// transaction was rolled back (422).
	UnknownSKU
	// KeyReused: the Idempotency-Key was used before with a different request
	// (422).
	KeyReused
	// NotFound: no such order (404).
	NotFound
	// NotCancellable: the order is already cancelled (409).
	NotCancellable
	// Malformed: a value is not text the API can store: invalid UTF-8, a NUL
	// character or U+FFFD in a field, the Idempotency-Key or the order id
	// (400). The detail names the field.
	Malformed
)

// Error is a request the service refused. Nothing was written for it.
type Error struct {
	Kind   ErrorKind
	Detail string
	// Errors lists the individual validation failures, when there are several.
	Errors []string
}

func (e *Error) Error() string { return e.Detail }

func refuse(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// Config configures a Service.
type Config struct {
	// Schema holds the outbox tables. Defaults to "outbox".
	Schema string
	// AppSchema holds the order tables. Defaults to Schema.
	AppSchema string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider receives the SERVER span of each request. Nil means
	// otel.GetTracerProvider(), a no-op unless the application set one.
	TracerProvider trace.TracerProvider
	// Writer says how events are recorded: WriterGo ("go", the default:
	// outbox.Writer) or WriterSQL ("sql": plain SQL calls of the outbox
	// schema's enqueue function, docs/sql-api.md; see events.go).
	Writer string
}

// Stats are the service's running totals.
type Stats struct {
	// Created counts orders committed.
	Created int64
	// Cancelled counts cancellations committed.
	Cancelled int64
	// RolledBack counts commands whose transaction wrote rows and then rolled
	// back (unknown SKU, failpoint, database error).
	RolledBack int64
	// Replayed counts creates answered from an earlier request with the same
	// Idempotency-Key (nothing written).
	Replayed int64
	// Refused counts requests refused before anything was written.
	Refused int64
}

// Service places, cancels and reads orders. It is safe for concurrent use.
type Service struct {
	pool   *pgxpool.Pool
	cfg    Config
	writer *outbox.Writer // nil with WriterSQL
	events eventWriter
	log    *slog.Logger
	q      queries

	created, cancelled, rolledBack, replayed, refused atomic.Int64

	notifier *outbox.Notifier
}

type queries struct {
	insertKey, selectKey, insertOrder, insertItems, unknownSKUs, cancel, selectOrder, selectItems string
	total                                                                                         string
	saga                                                                                          sagaQueries
}

// New returns a service over pool. Call Migrate before the first request
// unless the tables exist.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if pool == nil {
		return nil, errors.New("ordersapi: New needs a pool")
	}
	if cfg.Schema == "" {
		cfg.Schema = pgident.DefaultSchema
	}
	if cfg.AppSchema == "" {
		cfg.AppSchema = cfg.Schema
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	app, err := pgident.NewSchema(cfg.AppSchema)
	if err != nil {
		return nil, err
	}
	events, w, err := newEventWriter(cfg.Writer, cfg.Schema)
	if err != nil {
		return nil, err
	}
	notifier, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Schema: cfg.Schema, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	orders, items, keys, products := app.Table("orders"), app.Table("order_items"), app.Table("order_idempotency_keys"), app.Table("products")
	return &Service{
		pool: pool, cfg: cfg, writer: w, events: events, log: cfg.Logger, notifier: notifier,
		q: queries{
			insertKey: `INSERT INTO ` + keys + ` (idempotency_key, request_hash, order_id) VALUES ($1, $2, $3)
ON CONFLICT (idempotency_key) DO NOTHING RETURNING true`,
			selectKey:   `SELECT request_hash, order_id FROM ` + keys + ` WHERE idempotency_key = $1`,
			insertOrder: `INSERT INTO ` + orders + ` (order_id, customer_id, status) VALUES ($1, $2, 'created') RETURNING created_at`,
			insertItems: `INSERT INTO ` + items + ` (order_id, sku, quantity, position)
SELECT $1, sku, quantity, position FROM unnest($2::text[], $3::int[]) WITH ORDINALITY AS i(sku, quantity, position)`,
			unknownSKUs: `SELECT sku FROM unnest($1::text[]) AS i(sku) WHERE NOT EXISTS (SELECT 1 FROM ` + products + ` p WHERE p.sku = i.sku)`,
			cancel: `UPDATE ` + orders + ` SET status = 'cancelled', cancelled_at = now(), cancel_reason = $2
WHERE order_id = $1 AND status IN ('created', 'confirmed') RETURNING customer_id, cancelled_at`,
			selectOrder: `SELECT customer_id, status, created_at, cancelled_at, coalesce(cancel_reason, '') FROM ` + orders + ` WHERE order_id = $1`,
			total: `SELECT coalesce(sum(p.price_cents::bigint * i.quantity), 0) FROM unnest($1::text[], $2::int[]) AS i(sku, quantity)
JOIN ` + products + ` p USING (sku)`,
			saga:        newSagaQueries(app),
			selectItems: `SELECT sku, quantity FROM ` + items + ` WHERE order_id = $1 ORDER BY position`,
		},
	}, nil
}

// Migrate applies the outbox migrations to Schema and the order tables'
// migrations to AppSchema.
func (s *Service) Migrate(ctx context.Context) error {
	if _, err := outboxmigrate.Migrate(ctx, s.pool, s.cfg.Schema); err != nil {
		return err
	}
	_, err := ordersdb.Migrate(ctx, s.pool, s.cfg.AppSchema, ordersdb.Orders)
	return err
}

// Writer is the outbox writer the service records events with; nil with
// WriterSQL.
func (s *Service) Writer() *outbox.Writer { return s.writer }

// Stats returns the service's running totals.
func (s *Service) Stats() Stats {
	return Stats{Created: s.created.Load(), Cancelled: s.cancelled.Load(), RolledBack: s.rolledBack.Load(),
		Replayed: s.replayed.Load(), Refused: s.refused.Load()}
}

// Validate checks the request against the API's rules. A field holding text
// PostgreSQL cannot store is refused as Malformed, any other broken rule as
// Invalid (see checkText).
func (r *CreateRequest) Validate() error {
	if problems := r.problems(); len(problems) > 0 {
		return refuseFields(problems)
	}
	return nil
}

// problems lists every rule the request breaks.
func (r *CreateRequest) problems() []*fieldProblem {
	var problems []*fieldProblem
	add := func(p *fieldProblem) {
		if p != nil {
			problems = append(problems, p)
		}
	}
	add(checkText("customer_id", r.CustomerID, MaxIDLength))
	switch {
	case len(r.Items) == 0:
		add(&fieldProblem{Field: "items", Reason: "must list at least one item"})
	case len(r.Items) > MaxItems:
		add(&fieldProblem{Field: "items", Reason: fmt.Sprintf("lists %d items, more than %d", len(r.Items), MaxItems)})
	}
	seen := map[string]bool{}
	for i, it := range r.Items {
		sku := fmt.Sprintf("items[%d].sku", i)
		if p := checkText(sku, it.SKU, MaxIDLength); p != nil {
			add(p)
		} else if seen[it.SKU] {
			add(&fieldProblem{Field: sku, Reason: fmt.Sprintf("%q is listed twice", it.SKU)})
		}
		seen[it.SKU] = true
		if it.Quantity <= 0 || it.Quantity > MaxQuantity {
			add(&fieldProblem{Field: fmt.Sprintf("items[%d].quantity", i),
				Reason: fmt.Sprintf("must be between 1 and %d, not %d", MaxQuantity, it.Quantity)})
		}
	}
	return problems
}

// hash identifies the request's content for idempotency: the canonical JSON
// of the parsed request, so whitespace and field order do not matter.
func (r *CreateRequest) hash() []byte {
	b, _ := json.Marshal(r)
	sum := sha256.Sum256(b)
	return sum[:]
}

func (s *Service) refusal(err error) error {
	var e *Error
	if errors.As(err, &e) {
		s.refused.Add(1)
	}
	return err
}

// Create places an order. With a non-empty idempotencyKey, a request repeated
// with the same key and content returns the order the first one created
// (replayed is true, nothing is written); the same key with different
// content is refused with KeyReused.
func (s *Service) Create(ctx context.Context, idempotencyKey string, req CreateRequest) (order Order, replayed bool, err error) {
	problems := req.problems()
	if idempotencyKey != "" {
		if p := checkText(HeaderIdempotencyKey, idempotencyKey, MaxKeyLength); p != nil {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return Order{}, false, s.refusal(refuseFields(problems))
	}
	hash := req.hash()
	id, err := uuid.NewV7()
	if err != nil {
		return Order{}, false, err
	}
	order = Order{ID: id.String(), CustomerID: req.CustomerID, Status: StatusCreated, Items: req.Items}

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Order{}, false, fmt.Errorf("begin: %w", err)
	}
	wrote := false
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if wrote {
				s.rolledBack.Add(1)
			}
		}
	}()

	if idempotencyKey != "" {
		// Concurrent requests with one key serialise on its unique index: the
		// second waits for the first to commit or roll back.
		var inserted bool
		err = tx.QueryRow(ctx, s.q.insertKey, idempotencyKey, hash, order.ID).Scan(&inserted)
		if errors.Is(err, pgx.ErrNoRows) {
			_ = tx.Rollback(ctx)
			return s.replay(ctx, idempotencyKey, hash)
		}
		if err != nil {
			return Order{}, false, fmt.Errorf("record idempotency key: %w", err)
		}
		wrote = true
	}
	if err = tx.QueryRow(ctx, s.q.insertOrder, order.ID, order.CustomerID).Scan(&order.CreatedAt); err != nil {
		return Order{}, false, fmt.Errorf("insert order: %w", err)
	}
	wrote = true
	order.CreatedAt = order.CreatedAt.UTC()
	skus := make([]string, len(req.Items))
	qtys := make([]int32, len(req.Items))
	for i, it := range req.Items {
		skus[i], qtys[i] = it.SKU, int32(it.Quantity)
	}
	if err = tx.QueryRow(ctx, s.q.total, skus, qtys).Scan(&order.TotalCents); err != nil {
		return Order{}, false, fmt.Errorf("order total: %w", err)
	}
	if err = s.sagaStart(ctx, tx, order.ID); err != nil {
		return Order{}, false, err
	}
	payload, err := json.Marshal(orderevents.OrderCreatedPayload{
		OrderID: order.ID, CustomerID: order.CustomerID, Items: order.Items, CreatedAt: order.CreatedAt,
		TotalCents: order.TotalCents})
	if err != nil {
		return Order{}, false, err
	}
	// The event is recorded before the items on purpose: an unknown SKU then
	// fails after the order row and its event were written, and rolling back
	// must take both away (invariant I2).
	if err = s.events.record(ctx, tx, outbox.Event{
		AggregateType: orderevents.AggregateType, AggregateID: order.ID,
		Type: orderevents.OrderCreated, Payload: payload,
	}); err != nil {
		return Order{}, false, err
	}
	if _, err = tx.Exec(ctx, s.q.insertItems, order.ID, skus, qtys); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation: unknown SKU
			_ = tx.Rollback(ctx)
			err = s.unknownSKU(ctx, skus)
			return Order{}, false, err
		}
		return Order{}, false, fmt.Errorf("insert items: %w", err)
	}
	if err = failpoint.Hit(FailpointBeforeCommit); err != nil {
		return Order{}, false, err
	}
	if err = tx.Commit(ctx); err != nil {
		return Order{}, false, fmt.Errorf("commit: %w", err)
	}
	wrote = false // committed: nothing to roll back any more
	s.created.Add(1)
	s.notify()
	if err := failpoint.Hit(FailpointAfterCommitBeforeResponse); err != nil {
		return Order{}, false, err // committed; the caller learns nothing, as with a lost response
	}
	return order, false, nil
}

// replay answers a create whose idempotency key is already recorded.
func (s *Service) replay(ctx context.Context, key string, hash []byte) (Order, bool, error) {
	var stored []byte
	var orderID string
	if err := s.pool.QueryRow(ctx, s.q.selectKey, key).Scan(&stored, &orderID); err != nil {
		return Order{}, false, fmt.Errorf("look up idempotency key: %w", err)
	}
	if !bytes.Equal(stored, hash) {
		return Order{}, false, s.refusal(refuse(KeyReused,
			"Idempotency-Key %q was already used for a different request (order %s)", key, orderID))
	}
	o, err := s.Get(ctx, orderID)
	if err != nil {
		return Order{}, false, err
	}
	s.replayed.Add(1)
	return o, true, nil
}

// unknownSKU builds the error for an order naming SKUs not in the catalogue.
func (s *Service) unknownSKU(ctx context.Context, skus []string) error {
	rows, err := s.pool.Query(ctx, s.q.unknownSKUs, skus)
	if err != nil {
		return refuse(UnknownSKU, "an item names a SKU that is not in the catalogue")
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(missing) == 0 {
		return refuse(UnknownSKU, "an item names a SKU that is not in the catalogue")
	}
	return refuse(UnknownSKU, "unknown SKU %q: the order was rolled back", missing[0])
}

// Cancel cancels an order and records OrderCancelled. Cancelling an order
// that is already cancelled is refused with NotCancellable.
func (s *Service) Cancel(ctx context.Context, orderID string) (order Order, err error) {
	if err := checkOrderID(orderID); err != nil {
		return Order{}, s.refusal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Order{}, fmt.Errorf("begin: %w", err)
	}
	wrote := false
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if wrote {
				s.rolledBack.Add(1)
			}
		}
	}()
	done, err := s.cancelTx(ctx, tx, orderID, ReasonCustomer, nil)
	if err != nil {
		return Order{}, fmt.Errorf("cancel order: %w", err)
	}
	if !done {
		_ = tx.Rollback(ctx)
		var status string
		err = s.pool.QueryRow(ctx, s.q.selectOrder, orderID).Scan(nil, &status, nil, nil, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			return Order{}, s.refusal(refuse(NotFound, "order %q does not exist", orderID))
		}
		if err != nil {
			return Order{}, err
		}
		return Order{}, s.refusal(refuse(NotCancellable, "order %s is already %s", orderID, status))
	}
	wrote = true
	if err = failpoint.Hit(FailpointBeforeCommit); err != nil {
		return Order{}, err
	}
	if err = tx.Commit(ctx); err != nil {
		return Order{}, fmt.Errorf("commit: %w", err)
	}
	wrote = false
	s.cancelled.Add(1)
	s.notify()
	if err := failpoint.Hit(FailpointAfterCommitBeforeResponse); err != nil {
		return Order{}, err
	}
	return s.Get(ctx, orderID)
}

// checkOrderID refuses an order id a client sent before it reaches the
// database: Malformed when it is not storable text (checkText), NotFound when
// it is not an id this API issues (a UUID in canonical form), since no order
// can have it.
func checkOrderID(orderID string) error {
	if p := checkText("{id}", orderID, MaxIDLength); p != nil && p.Malformed {
		return refuseFields([]*fieldProblem{p})
	}
	if id, err := uuid.Parse(orderID); err != nil || id.String() != orderID {
		return refuse(NotFound, "order %q does not exist", orderID)
	}
	return nil
}

// Get returns an order, or an error of kind NotFound (Malformed for an id
// that is not storable text).
func (s *Service) Get(ctx context.Context, orderID string) (Order, error) {
	if err := checkOrderID(orderID); err != nil {
		return Order{}, err
	}
	// One snapshot for the order, its items and its saga, so that they agree.
	var o Order
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		o, err = s.get(ctx, tx, orderID)
		return err
	})
	return o, err
}

func (s *Service) get(ctx context.Context, db querier, orderID string) (Order, error) {
	o := Order{ID: orderID}
	err := db.QueryRow(ctx, s.q.selectOrder, orderID).Scan(&o.CustomerID, &o.Status, &o.CreatedAt, &o.CancelledAt, &o.CancelReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, refuse(NotFound, "order %q does not exist", orderID)
	}
	if err != nil {
		return Order{}, fmt.Errorf("read order: %w", err)
	}
	o.CreatedAt = o.CreatedAt.UTC()
	if o.CancelledAt != nil {
		t := o.CancelledAt.UTC()
		o.CancelledAt = &t
	}
	rows, err := db.Query(ctx, s.q.selectItems, orderID)
	if err != nil {
		return Order{}, fmt.Errorf("read order items: %w", err)
	}
	o.Items, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Item, error) {
		var it Item
		err := r.Scan(&it.SKU, &it.Quantity)
		return it, err
	})
	if err != nil {
		return Order{}, fmt.Errorf("read order items: %w", err)
	}
	skus := make([]string, len(o.Items))
	qtys := make([]int32, len(o.Items))
	for i, it := range o.Items {
		skus[i], qtys[i] = it.SKU, int32(it.Quantity)
	}
	if err := db.QueryRow(ctx, s.q.total, skus, qtys).Scan(&o.TotalCents); err != nil {
		return Order{}, fmt.Errorf("order total: %w", err)
	}
	if o.Saga, err = s.saga(ctx, db, orderID); err != nil {
		return Order{}, err
	}
	return o, nil
}

// notify wakes the relays after a commit, off the request path and
// coalesced (outbox.Notifier): while one NOTIFY is in flight, any number of
// further commits cause exactly one more, sent after it. So every commit is
// followed by a NOTIFY issued after it, and a burst of commits costs two. It
// is best effort: relays poll anyway, so a failure only delays publication.
func (s *Service) notify() { s.notifier.Notify() }
