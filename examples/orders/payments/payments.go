package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersdb"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/sideeffect"
)

// Defaults of Config.
const (
	DurableDefault        = "payments"
	InboxConsumerDefault  = "payments"
	WorkersDefault        = 4
	AckWaitDefault        = 60 * time.Second
	RefundAttemptsDefault = 8
	RetryDelayDefault     = 250 * time.Millisecond
	RetryDelayMax         = 10 * time.Second
	// The side-effect helper's names (side_effects.name).
	ChargeName = "payments.charge"
	RefundName = "payments.refund"
)

// Settings are the settings the example NATS consumers share.
type Settings = natsloop.Settings

// Config configures a Consumer.
type Config struct {
	// Settings are the NATS consumer's settings: Schema holds the outbox,
	// inbox and side_effects tables; Durable is the durable consumers' name
	// prefix; AckWait bounds the handling of one delivery (a charge and its
	// record), so it must exceed CallTimeout.
	Settings
	// AppSchema holds the payments table. Defaults to Schema.
	AppSchema string
	// Provider is the payment provider's client; Mode is the provider's
	// mode, which decides the helper's mode and lookups.
	Provider *provider.Client
	Mode     provider.Mode
	// BlindRetry, in mode neither only, calls the provider again after an
	// unknown outcome (a counted possible duplicate) instead of parking it.
	BlindRetry bool
	// CallTimeout, CheckInterval, MaxCheckInterval and MaxChecks are the
	// helper's (sideeffect.Config).
	CallTimeout      time.Duration
	CheckInterval    time.Duration
	MaxCheckInterval time.Duration
	MaxChecks        int
	// RefundAttempts bounds the deliveries of an OrderCancelled whose
	// refund stays unknown; then RefundUnknown is recorded (the saga waits,
	// parked with the reason), the event waits on the refund's attempt
	// (sideeffect.Caller.WaitTx), and the helper's Resume records
	// PaymentRefunded or RefundFailed once the outcome is known. Defaults
	// to RefundAttemptsDefault.
	RefundAttempts int
	// Observer receives the helper's observations (metrics). Optional.
	Observer sideeffect.Observer
}

// Stats are the consumer's running totals.
type Stats struct {
	Captured, Declined, Refunded, RefundFailed, SkippedCancelled int64
	// RefundsUnknown counts refunds recorded as unknown (RefundUnknown):
	// the saga waits while the resolver learns their outcome.
	RefundsUnknown int64
	// ChargesParked counts charges whose call the helper parked for an
	// operator: their StockReserved was acknowledged, waiting on the
	// attempt, and the helper's Resume charges or fails the order once the
	// call is resolved.
	ChargesParked int64
	// Retried counts deliveries handed back for a redelivery (unknown
	// outcomes, errors, early events).
	Retried int64
}

// Consumer charges and refunds orders. It is safe for concurrent use.
type Consumer struct {
	pool           *pgxpool.Pool
	cfg            Config
	inbox          *inbox.Inbox
	writer         *outbox.Writer
	charge, refund *sideeffect.Caller
	admin          *sideeffect.Admin
	log            *slog.Logger
	q              struct{ ensure, lock, set string }

	captured, declined, refunded, refundFailed, refundsUnknown, chargesParked, skipped, retried atomic.Int64
}

// Migrate applies the outbox migrations (inbox, side_effects) to schema and
// the payments table to appSchema (schema when empty).
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema, appSchema string) error {
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if appSchema == "" {
		appSchema = schema
	}
	_, err := ordersdb.Migrate(ctx, pool, appSchema, ordersdb.Payments)
	return err
}

// New returns a consumer; Run it, or hand it events with Handle.
func New(pool *pgxpool.Pool, cfg Config) (*Consumer, error) {
	if pool == nil || cfg.Provider == nil {
		return nil, errors.New("payments: New needs a pool and a provider client")
	}
	cfg.Settings = natsloop.WithDefaults(cfg.Settings, Settings{Durable: DurableDefault, InboxConsumer: InboxConsumerDefault,
		Workers: WorkersDefault, AckWait: AckWaitDefault, RetryDelay: RetryDelayDefault})
	if cfg.AppSchema == "" {
		cfg.AppSchema = cfg.Schema
	}
	if cfg.RefundAttempts <= 0 {
		cfg.RefundAttempts = RefundAttemptsDefault
	}
	if cfg.Mode == "" {
		cfg.Mode = provider.ModeIdempotent
	}
	if need := PoolSize(cfg.Workers); pool.Config().MaxConns < need {
		return nil, fmt.Errorf("payments: the pool has %d connections, %d workers need %d: each delivery holds one in its inbox transaction while the side-effect helper records the call with another (pool_max_conns in the database URL)",
			pool.Config().MaxConns, cfg.Workers, need)
	}
	app, err := pgident.NewSchema(cfg.AppSchema)
	if err != nil {
		return nil, err
	}
	in, err := inbox.New(pool, inbox.Config{Consumer: cfg.InboxConsumer, Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	c := &Consumer{pool: pool, cfg: cfg, inbox: in, writer: w, admin: admin, log: cfg.Logger}
	if c.charge, err = c.caller(ChargeName, chargeLookup(cfg.Provider, cfg.Mode)); err != nil {
		return nil, err
	}
	if c.refund, err = c.caller(RefundName, refundLookup(cfg.Provider, cfg.Mode)); err != nil {
		return nil, err
	}
	t := app.Table("payments")
	c.q.ensure = `INSERT INTO ` + t + ` (order_id, status) VALUES ($1, 'cancelled_before_charge') ON CONFLICT (order_id) DO NOTHING RETURNING true`
	c.q.lock = `SELECT status, cancelled, coalesce(charge_id, ''), amount_cents FROM ` + t + ` WHERE order_id = $1 FOR UPDATE`
	c.q.set = `UPDATE ` + t + ` SET status = $2, amount_cents = $3, charge_id = coalesce(NULLIF($4, ''), charge_id),
refund_id = coalesce(NULLIF($5, ''), refund_id), reason = NULLIF($6, ''), cancelled = cancelled OR $7, updated_at = now() WHERE order_id = $1`
	return c, nil
}

func (c *Consumer) caller(name string, lookup sideeffect.Lookup) (*sideeffect.Caller, error) {
	sc := sideeffect.Config{Name: name, Schema: c.cfg.Schema, Lookup: lookup, CallTimeout: c.cfg.CallTimeout,
		CheckInterval: c.cfg.CheckInterval, MaxCheckInterval: c.cfg.MaxCheckInterval, MaxChecks: c.cfg.MaxChecks, Observer: c.cfg.Observer, Logger: c.log}
	switch c.cfg.Mode {
	case provider.ModeIdempotent:
		sc.Mode = sideeffect.Idempotent
	case provider.ModeQueryable:
		sc.Mode = sideeffect.Queryable
	case provider.ModeNeither:
		sc.Mode, sc.BlindRetry = sideeffect.Neither, c.cfg.BlindRetry
	default:
		return nil, fmt.Errorf("payments: unknown provider mode %q", c.cfg.Mode)
	}
	return sideeffect.New(c.pool, sc)
}

// PoolSize is the least pool size of a consumer with workers workers: per
// aggregate type consumed (2), each worker holds a connection in its inbox
// transaction while the side-effect helper takes another; two more for the
// reconcilers, and three per caller (charges, refunds) for Resume: its
// listening connection, and a waiting event's transaction while the helper
// records its call with another.
func PoolSize(workers int) int32 { return int32(2*2*workers + 2 + 2*3) }

// Callers are the helper's callers of the charges and the refunds, for
// Reconcile and status.
func (c *Consumer) Callers() []*sideeffect.Caller { return []*sideeffect.Caller{c.charge, c.refund} }

// Stats returns the running totals.
func (c *Consumer) Stats() Stats {
	return Stats{Captured: c.captured.Load(), Declined: c.declined.Load(), Refunded: c.refunded.Load(),
		RefundFailed: c.refundFailed.Load(), RefundsUnknown: c.refundsUnknown.Load(), ChargesParked: c.chargesParked.Load(),
		SkippedCancelled: c.skipped.Load(), Retried: c.retried.Load()}
}

// Handle applies one delivery (delivery counts from 1) through the inbox.
// A nil error settles it; else it is to be delivered again after the
// returned delay.
func (c *Consumer) Handle(ctx context.Context, msg outbox.Message, delivery int) (time.Duration, error) {
	out, err := c.inbox.Handle(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		return c.apply(ctx, tx, msg, delivery)
	})
	if err == nil && out == inbox.Early {
		err = natsloop.ErrEarly
	}
	if err != nil {
		c.retried.Add(1)
		return inbox.Backoff{Min: c.cfg.RetryDelay, Max: RetryDelayMax}.Delay(delivery), err
	}
	return 0, nil
}

// Run consumes StockReserved and OrderCancelled from NATS JetStream until
// ctx ends, and reconciles the helper's unknown attempts meanwhile.
func (c *Consumer) Run(ctx context.Context, js jetstream.JetStream) error {
	for _, sc := range c.Callers() {
		go func() { _ = sc.Reconcile(ctx) }()
	}
	go func() {
		_ = c.charge.Resume(ctx, sideeffect.Resumer{Consumer: c.cfg.InboxConsumer, Handle: c.resumeCharge})
	}()
	go func() {
		_ = c.refund.Resume(ctx, sideeffect.Resumer{Consumer: c.cfg.InboxConsumer, Handle: c.resumeRefund})
	}()
	c.log.Info("payments consumer starting", slog.String("durable", c.cfg.Durable), slog.String("mode", string(c.cfg.Mode)))
	return natsloop.Run(ctx, js, natsloop.Config{
		Stream: c.cfg.Stream, SubjectPrefix: c.cfg.SubjectPrefix, Durable: c.cfg.Durable,
		Description:    "example payments consumer (charges reserved orders, refunds cancelled ones)",
		AggregateTypes: []string{orderevents.InventoryAggregateType, orderevents.AggregateType},
		Workers:        c.cfg.Workers, AckWait: c.cfg.AckWait, Logger: c.log,
	}, c.Handle)
}

func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, msg outbox.Message, delivery int) error {
	switch msg.Type {
	case orderevents.StockReserved:
		var p orderevents.StockPayload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return fmt.Errorf("decode %s payload: %w", msg.Type, err)
		}
		return c.chargeOrder(ctx, tx, msg, p.TotalCents, delivery)
	case orderevents.OrderCancelled:
		return c.refundOrder(ctx, tx, msg, delivery)
	}
	return nil
}

type row struct {
	status, chargeID string
	cancelled        bool
	amount           int64
}

// lockRow creates the order's row if missing (as cancelled_before_charge,
// to be overwritten) and locks it; fresh says it was just created.
func (c *Consumer) lockRow(ctx context.Context, tx pgx.Tx, orderID string) (r row, fresh bool, err error) {
	err = tx.QueryRow(ctx, c.q.ensure, orderID).Scan(&fresh)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return row{}, false, fmt.Errorf("payments row: %w", err)
	}
	if err := tx.QueryRow(ctx, c.q.lock, orderID).Scan(&r.status, &r.cancelled, &r.chargeID, &r.amount); err != nil {
		return row{}, false, fmt.Errorf("payments row: %w", err)
	}
	return r, fresh, nil
}

func (c *Consumer) set(ctx context.Context, tx pgx.Tx, orderID, status string, amount int64, chargeID, refundID, reason string, cancelled bool) error {
	if _, err := tx.Exec(ctx, c.q.set, orderID, status, amount, chargeID, refundID, reason, cancelled); err != nil {
		return fmt.Errorf("payments row: %w", err)
	}
	return nil
}

func (c *Consumer) record(ctx context.Context, tx pgx.Tx, typ string, p orderevents.PaymentPayload) error {
	p.Currency = orderevents.Currency
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, err := c.writer.InsertTx(ctx, tx, outbox.Event{
		AggregateType: orderevents.PaymentAggregateType, AggregateID: p.OrderID, Type: typ, Payload: b}); err != nil {
		return fmt.Errorf("record %s: %w", typ, err)
	}
	return nil
}

// chargeOrder charges an order whose stock is reserved, unless it was
// cancelled first.
func (c *Consumer) chargeOrder(ctx context.Context, tx pgx.Tx, msg outbox.Message, amount int64, delivery int) error {
	orderID := msg.AggregateID
	r, fresh, err := c.lockRow(ctx, tx, orderID)
	if err != nil {
		return err
	}
	cancelled := !fresh && r.cancelled
	if cancelled {
		// An earlier delivery may have called the provider before the
		// cancellation came (its outcome unknown, its transaction rolled
		// back): then its outcome is learnt, and a charge refunded.
		_, err := c.admin.Attempt(ctx, ChargeName, ChargeKey(orderID))
		if err != nil && !errors.Is(err, sideeffect.ErrNotFound) {
			return err
		}
		cancelled = errors.Is(err, sideeffect.ErrNotFound)
	}
	if cancelled {
		c.skipped.Add(1)
		return c.record(ctx, tx, orderevents.PaymentFailed, orderevents.PaymentPayload{OrderID: orderID, AmountCents: amount,
			Reason: "order cancelled before the charge"})
	}
	res, err := c.callCharge(ctx, orderID, amount)
	if errors.Is(err, sideeffect.ErrParked) {
		return c.chargeParked(ctx, tx, msg, amount, err)
	}
	if err != nil {
		return err // unknown or in progress: the event comes again
	}
	return c.chargeKnown(ctx, tx, msg, r.cancelled, amount, res, delivery)
}

// callCharge charges the order through the helper, with the order's
// charge key.
func (c *Consumer) callCharge(ctx context.Context, orderID string, amount int64) (sideeffect.Result, error) {
	req := provider.ChargeRequest{Reference: ChargeKey(orderID), Amount: amount, Currency: orderevents.Currency}
	body, err := json.Marshal(req)
	if err != nil {
		return sideeffect.Result{}, err
	}
	return c.charge.Do(ctx, ChargeKey(orderID), body, func(ctx context.Context, key string) ([]byte, error) {
		ch, err := c.cfg.Provider.Charge(ctx, key, req)
		return outcome(ch, err)
	})
}

// chargeParked applies a StockReserved whose charge the helper parked for
// an operator: the payments row says charge_parked with the reason, the
// event waits on the charge's attempt (WaitTx, in the inbox transaction),
// and it is acknowledged rather than redelivered until the operator acts
// (each redelivery would only find the attempt parked again). The
// helper's Resume runs resumeCharge once the attempt is resolved.
func (c *Consumer) chargeParked(ctx context.Context, tx pgx.Tx, msg outbox.Message, amount int64, cause error) error {
	orderID := msg.AggregateID
	reason := fmt.Sprintf("its call is parked in the side-effect helper for an operator: %v; payments records the outcome once resolved (outbox sideeffect resolve --name %s --key %s)",
		cause, ChargeName, ChargeKey(orderID))
	c.chargesParked.Add(1)
	c.log.Warn("charge parked for an operator; the order waits for its resolution", slog.String("order_id", orderID), slog.String("reason", reason))
	if err := c.set(ctx, tx, orderID, "charge_parked", amount, "", "", reason, false); err != nil {
		return err
	}
	return c.charge.WaitTx(ctx, tx, sideeffect.Wait{Consumer: c.cfg.InboxConsumer, Key: ChargeKey(orderID), Message: msg})
}

// resumeCharge is the helper's Resume handler of a StockReserved waiting on
// its parked charge, run once an operator resolved the call (`outbox
// sideeffect resolve`): Do, called again with the same key and request,
// answers the operator's outcome or, after a retry, calls with the same
// key; PaymentCaptured (and the refund, when the order was cancelled
// meanwhile) or PaymentFailed is recorded with the payments row, in the
// transaction that ends the wait. Parked again, the event waits again; an
// outcome still unknown is tried again after the helper's backoff.
func (c *Consumer) resumeCharge(ctx context.Context, tx pgx.Tx, msg outbox.Message) error {
	orderID := msg.AggregateID
	r, _, err := c.lockRow(ctx, tx, orderID)
	if err != nil {
		return err
	}
	if r.status != "charge_parked" {
		return nil // settled meanwhile: the wait ends
	}
	res, err := c.callCharge(ctx, orderID, r.amount)
	if errors.Is(err, sideeffect.ErrParked) {
		return c.charge.WaitTx(ctx, tx, sideeffect.Wait{Consumer: c.cfg.InboxConsumer, Key: ChargeKey(orderID), Message: msg})
	}
	if err != nil {
		return err
	}
	c.log.Info("parked charge resolved", slog.String("order_id", orderID), slog.String("state", string(res.State)),
		slog.String("via", res.Via))
	// A refund due (cancelled meanwhile) whose outcome is unknown is
	// recorded as RefundUnknown at once, the event then waiting on it.
	return c.chargeKnown(ctx, tx, msg, r.cancelled, r.amount, res, c.cfg.RefundAttempts)
}

// chargeKnown records a charge whose outcome the helper knows: captured
// (PaymentCaptured, and the refund when the order was cancelled meanwhile)
// or declined (PaymentFailed).
func (c *Consumer) chargeKnown(ctx context.Context, tx pgx.Tx, msg outbox.Message, cancelled bool, amount int64, res sideeffect.Result, delivery int) error {
	orderID := msg.AggregateID
	var ch provider.Charge
	_ = json.Unmarshal(res.Response, &ch)
	if res.State == sideeffect.Failed {
		reason := ch.FailureCode
		if reason == "" {
			reason = res.Error
		}
		if res.Via == "operator" {
			reason = "an operator resolved the charge's call as failed (outbox sideeffect resolve)"
		}
		c.declined.Add(1)
		if err := c.set(ctx, tx, orderID, "failed", amount, "", "", reason, false); err != nil {
			return err
		}
		return c.record(ctx, tx, orderevents.PaymentFailed, orderevents.PaymentPayload{OrderID: orderID, AmountCents: amount, Reason: "declined: " + reason})
	}
	c.captured.Add(1)
	if err := c.set(ctx, tx, orderID, "captured", amount, ch.ID, "", "", false); err != nil {
		return err
	}
	if err := c.record(ctx, tx, orderevents.PaymentCaptured, orderevents.PaymentPayload{OrderID: orderID, AmountCents: amount, ChargeID: ch.ID}); err != nil {
		return err
	}
	if cancelled {
		return c.refundOrder(ctx, tx, msg, delivery) // cancelled meanwhile: compensate now
	}
	return nil
}

// refundOrder compensates a cancelled order's charge.
func (c *Consumer) refundOrder(ctx context.Context, tx pgx.Tx, msg outbox.Message, delivery int) error {
	orderID := msg.AggregateID
	r, _, err := c.lockRow(ctx, tx, orderID)
	if err != nil {
		return err
	}
	if r.status != "captured" {
		// Nothing charged (yet): a later StockReserved charges nothing.
		return c.set(ctx, tx, orderID, r.status, r.amount, "", "", "", true)
	}
	res, err := c.callRefund(ctx, r.chargeID, orderID)
	switch {
	case err == nil:
		return c.refundKnown(ctx, tx, orderID, r, res)
	case errors.Is(err, sideeffect.ErrFingerprintMismatch):
		return c.recordRefundFailed(ctx, tx, orderID, r, "its key was used before for another refund: "+err.Error())
	case errors.Is(err, sideeffect.ErrParked):
		// An operator decides (outbox sideeffect resolve); the event
		// waits on the attempt, and resumeRefund records what they
		// decided.
		return c.refundUnknown(ctx, tx, msg, r, "its call is parked in the side-effect helper for an operator: "+err.Error())
	case delivery >= c.cfg.RefundAttempts:
		// Not "failed": the refund may have happened and be learnt later
		// (the helper's reconciler, or Do once the attempt is due again).
		// Stop holding the cancellation; the event waits on the attempt.
		return c.refundUnknown(ctx, tx, msg, r, fmt.Sprintf("outcome still unknown after %d attempts: %v", delivery, err))
	default:
		return err // retried with the redelivery's backoff
	}
}

// callRefund refunds the order's charge through the helper, with the
// order's refund key.
func (c *Consumer) callRefund(ctx context.Context, chargeID, orderID string) (sideeffect.Result, error) {
	req := provider.RefundRequest{Charge: chargeID}
	body, err := json.Marshal(req)
	if err != nil {
		return sideeffect.Result{}, err
	}
	return c.refund.Do(ctx, RefundKey(orderID), body, func(ctx context.Context, key string) ([]byte, error) {
		rf, err := c.cfg.Provider.Refund(ctx, key, req)
		return outcome(rf, err)
	})
}

// refundKnown records a refund whose outcome the helper knows: succeeded
// (PaymentRefunded) or refused for good (RefundFailed).
func (c *Consumer) refundKnown(ctx context.Context, tx pgx.Tx, orderID string, r row, res sideeffect.Result) error {
	var rf provider.Refund
	_ = json.Unmarshal(res.Response, &rf)
	if res.State != sideeffect.Succeeded {
		reason := "refused by the provider: " + rf.FailureCode + res.Error
		if res.Via == "operator" {
			reason = "an operator resolved the refund's call as failed (outbox sideeffect resolve)"
		}
		return c.recordRefundFailed(ctx, tx, orderID, r, reason)
	}
	c.refunded.Add(1)
	if err := c.set(ctx, tx, orderID, "refunded", r.amount, "", rf.ID, "", true); err != nil {
		return err
	}
	return c.record(ctx, tx, orderevents.PaymentRefunded, orderevents.PaymentPayload{OrderID: orderID,
		AmountCents: r.amount, ChargeID: r.chargeID, RefundID: rf.ID})
}

func (c *Consumer) recordRefundFailed(ctx context.Context, tx pgx.Tx, orderID string, r row, reason string) error {
	c.refundFailed.Add(1)
	c.log.Error("refund failed; the saga needs attention", slog.String("order_id", orderID), slog.String("reason", reason))
	if err := c.set(ctx, tx, orderID, "refund_failed", r.amount, "", "", reason, true); err != nil {
		return err
	}
	return c.record(ctx, tx, orderevents.RefundFailed, orderevents.PaymentPayload{OrderID: orderID,
		AmountCents: r.amount, ChargeID: r.chargeID, Reason: reason})
}

// refundUnknown parks the saga while the refund's outcome is unknown: the
// payments row says refund_unknown with the reason, RefundUnknown tells the
// saga, and the event waits on the refund's attempt (WaitTx): the helper's
// Resume runs resumeRefund once the attempt is due (resolved by an
// operator, or due for its next check), which records the outcome once
// the helper knows it.
func (c *Consumer) refundUnknown(ctx context.Context, tx pgx.Tx, msg outbox.Message, r row, reason string) error {
	orderID := msg.AggregateID
	reason += fmt.Sprintf("; payments records the outcome once known (outbox sideeffect show --name %s --key %s)", RefundName, RefundKey(orderID))
	c.refundsUnknown.Add(1)
	c.log.Warn("refund outcome unknown; the saga waits for it", slog.String("order_id", orderID), slog.String("reason", reason))
	if err := c.set(ctx, tx, orderID, "refund_unknown", r.amount, "", "", reason, true); err != nil {
		return err
	}
	if err := c.record(ctx, tx, orderevents.RefundUnknown, orderevents.PaymentPayload{OrderID: orderID,
		AmountCents: r.amount, ChargeID: r.chargeID, Reason: reason}); err != nil {
		return err
	}
	return c.refund.WaitTx(ctx, tx, sideeffect.Wait{Consumer: c.cfg.InboxConsumer, Key: RefundKey(orderID), Message: msg})
}

// resumeRefund is the helper's Resume handler of an event waiting on a
// refund whose outcome is unknown (payments row refund_unknown), run once
// its attempt is due: resolved by an operator, or unknown and due for its
// next check. It calls Do again with the refund's key (which answers from
// the record, looks the key up, or calls again as the provider's mode
// allows) and, once the outcome is known, records PaymentRefunded or
// RefundFailed with the payments row, in the transaction that ends the
// wait. Still unknown (or parked), it returns the helper's error: the
// event waits on, tried again after the helper's backoff (or at the
// attempt's resolution).
func (c *Consumer) resumeRefund(ctx context.Context, tx pgx.Tx, msg outbox.Message) error {
	orderID := msg.AggregateID
	r, _, err := c.lockRow(ctx, tx, orderID)
	if err != nil {
		return err
	}
	if r.status != "refund_unknown" {
		return nil // settled meanwhile: the wait ends
	}
	res, err := c.callRefund(ctx, r.chargeID, orderID)
	switch {
	case errors.Is(err, sideeffect.ErrFingerprintMismatch):
		return c.recordRefundFailed(ctx, tx, orderID, r, "its key was used before for another refund: "+err.Error())
	case err != nil:
		return err
	}
	return c.refundKnown(ctx, tx, orderID, r, res)
}

// ResumeWaiting runs one round of the helper's Resume for the charges and
// the refunds (sideeffect.Caller.ResumeOnce): the events waiting on an
// attempt that is due now. Run does this in the background, woken by an
// operator's resolution; tests call it to see that nothing is left.
func (c *Consumer) ResumeWaiting(ctx context.Context) (sideeffect.ResumeReport, error) {
	var sum sideeffect.ResumeReport
	for _, r := range []struct {
		c *sideeffect.Caller
		h func(context.Context, pgx.Tx, outbox.Message) error
	}{{c.charge, c.resumeCharge}, {c.refund, c.resumeRefund}} {
		rep, err := r.c.ResumeOnce(ctx, sideeffect.Resumer{Consumer: c.cfg.InboxConsumer, Handle: r.h})
		sum.Resumed += rep.Resumed
		sum.Waiting += rep.Waiting
		if err != nil {
			return sum, err
		}
	}
	return sum, nil
}

// ChargeKey is the idempotency key, and the reference, of an order's
// charge; RefundKey the key of its refund.
func ChargeKey(orderID string) string { return sideeffect.Key(orderID, "charge") }

// RefundKey is the idempotency key of an order's refund.
func RefundKey(orderID string) string { return sideeffect.Key(orderID, "refund") }

// outcome classifies a provider client's answer for the helper: a definite
// refusal is Rejected (recorded as failed, never called again), an
// ambiguous one a plain error (unknown).
func outcome(v any, err error) ([]byte, error) {
	b, merr := json.Marshal(v)
	if merr != nil {
		return nil, merr
	}
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, provider.ErrDeclined), errors.Is(err, provider.ErrInvalid), errors.Is(err, provider.ErrKeyReused),
		errors.Is(err, provider.ErrNotFound):
		return b, sideeffect.Rejected(err)
	}
	var api *provider.APIError
	if !errors.As(err, &api) {
		// Failed before the request was sent (it could not be built).
		return nil, sideeffect.NotSent(err)
	}
	return nil, err
}

// HTTPClient is the provider client's HTTP client: no timeout of its own
// (the helper's CallTimeout bounds each call).
func HTTPClient() *http.Client { return &http.Client{} }
