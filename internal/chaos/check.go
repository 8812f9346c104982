package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
)

// Invariant names, in report order: I1-I5 of the design, the request
// idempotency of the order API, and the client's unexpected answers.
var Invariants = []string{"I1", "I2", "I3", "I4", "I5", "idempotency", "responses"}

// Descriptions of the invariants, for reports.
var Descriptions = map[string]string{
	"I1":          "every committed order/cancel has exactly one intent",
	"I2":          "no intent (and no row) for a command that did not commit",
	"I3":          "every intent published and at the destination",
	"I4":          "every effect applied exactly once (inbox rows, stock, reservations)",
	"I5":          "per order, first publication and application in sequence order",
	"idempotency": "one order per Idempotency-Key, replays return it",
	"responses":   "every HTTP answer was one the API may give",
}

// Where names the run's tables and consumer; the Destination names the
// stream or topic.
type Where struct {
	Schema string // outbox and business tables
	// Durable (the NATS durable consumer, or the Kafka consumer group) and
	// InboxConsumer default to the inventory's defaults.
	Durable       string
	InboxConsumer string
	// Saga: the order saga runs too (saga.go): the inventory's and the
	// payments' events (aggregate types inventory and payment) are expected
	// in the outbox beside the order events; I1-I5 look at the order events
	// only and CheckSaga adds I6 and I7.
	Saga bool
	// BlindRetry: in provider mode neither, the payments consumer calls
	// the provider again after an unknown outcome (a blind retry) instead
	// of parking the call, so that an order may be captured more than once:
	// CheckSaga then checks I7 in its relaxed form (SagaFigures.RelaxedI7).
	BlindRetry bool
}

func (w Where) withDefaults() Where {
	if w.Durable == "" {
		w.Durable = inventory.DurableDefault
	}
	if w.InboxConsumer == "" {
		w.InboxConsumer = inventory.InboxConsumerDefault
	}
	return w
}

func (w Where) table(name string) string { return pgx.Identifier{w.Schema, name}.Sanitize() }

// Figures are the counts a check reports.
type Figures struct {
	Commands, Requests, Commits, CreatesCommitted, CancelsCommitted int
	Rollbacks, Refused, NotSent, Ambiguous, ResolvedByDB, Replays   int
	KeyReusesRefused                                                int
	// Events and Published count the order events (aggregate type order),
	// the ones I1-I5 are about.
	Events, Published int64
	// SagaEvents and SagaPublished count the saga's events (aggregate
	// types inventory and payment) in the same outbox, with Where.Saga.
	SagaEvents, SagaPublished           int64
	StreamMessages, DuplicatesPublished int64
	// Deliveries is -1 where the destination does not count them.
	Deliveries, DuplicatesDelivered int64
	// Destination is the destination's kind ("nats", "kafka").
	Destination string
}

// Report is the outcome of Check: the figures and the violations found per
// invariant.
type Report struct {
	Figures
	Violations map[string][]string
	counts     map[string]int
	// Saga holds the saga's figures once CheckSaga ran (nil without a saga).
	Saga *SagaFigures
}

func newReport() *Report {
	return &Report{Violations: map[string][]string{}, counts: map[string]int{}}
}

// Violate records a violation of invariant inv (details beyond the first 10
// are counted, not kept).
func (r *Report) Violate(inv, format string, args ...any) {
	r.counts[inv]++
	if len(r.Violations[inv]) < 10 {
		r.Violations[inv] = append(r.Violations[inv], fmt.Sprintf(format, args...))
	}
}

// Count returns the number of violations of inv.
func (r *Report) Count(inv string) int { return r.counts[inv] }

// Total returns the number of violations of all invariants.
func (r *Report) Total() int {
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

// Err returns an error listing the violated invariants, or nil.
func (r *Report) Err() error {
	var errs []error
	for _, inv := range r.invariants() {
		if n := r.counts[inv]; n > 0 {
			errs = append(errs, fmt.Errorf("%s violated %d times: %v", inv, n, r.Violations[inv]))
		}
	}
	return errors.Join(errs...)
}

// Progress is how far the system has come with the committed events.
type Progress struct {
	Events, Unpublished, Quarantined, Processed int64
	// NumPending and NumAckPending are the consumer's (Destination's
	// ConsumerProgress Pending and InFlight); NumPending is -1 while the
	// consumer does not exist.
	NumPending, NumAckPending int64
	Deliveries                int64
}

// Converged reports whether every event is published and applied and the
// consumer has nothing pending.
func (p Progress) Converged() bool {
	return p.Unpublished == 0 && p.Processed == p.Events && p.NumPending == 0 && p.NumAckPending == 0
}

// String describes the progress in one line.
func (p Progress) String() string {
	return fmt.Sprintf("%d events, %d unpublished (%d quarantined), %d applied, consumer pending %d, awaiting ack %d",
		p.Events, p.Unpublished, p.Quarantined, p.Processed, p.NumPending, p.NumAckPending)
}

// GetProgress reads the progress from PostgreSQL and the destination's
// consumer.
func GetProgress(ctx context.Context, pool *pgxpool.Pool, dest Destination, w Where) (Progress, error) {
	w = w.withDefaults()
	var p Progress
	if err := pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+w.table("outbox_events")+` WHERE aggregate_type = $2),
	(SELECT count(*) FROM `+w.table("outbox_events")+` WHERE published_at IS NULL AND aggregate_type = $2),
	(SELECT count(*) FROM `+w.table("outbox_events")+` WHERE quarantined_at IS NOT NULL),
	(SELECT count(*) FROM `+w.table("processed_events")+` WHERE consumer_name = $1)`, w.InboxConsumer, orderevents.AggregateType).
		Scan(&p.Events, &p.Unpublished, &p.Quarantined, &p.Processed); err != nil {
		return p, err
	}
	c, err := dest.Progress(ctx, w.Durable)
	if err != nil {
		return p, err
	}
	if !c.Exists {
		p.NumPending = -1 // not created yet
		return p, nil
	}
	p.NumPending, p.NumAckPending, p.Deliveries = c.Pending, c.InFlight, c.Deliveries
	return p, nil
}

// WaitConverged polls until every event is published and applied and the
// consumer has nothing pending, or ctx ends.
// WaitWritesEnded waits until no session named appName (System.AppName)
// has a transaction that began before since, the database's clock: the
// writes the driver's last, cancelled requests started are then committed
// or rolled back. Without it the checks could run while a cancelled
// request's COMMIT was still on its way: convergence, then Resolve, saw no
// order, and the commit landed after them (a create judged rolled back that
// left an intent, CI of 7 December 2026).
func WaitWritesEnded(ctx context.Context, pool *pgxpool.Pool, appName string, since time.Time) error {
	for {
		var open int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND xact_start < $2`, appName, since).Scan(&open)
		if err == nil && open == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("%d transactions of %q begun before %s still open", open, appName, since.Format(time.RFC3339Nano))
			}
			return fmt.Errorf("wait for the API's writes to end: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func WaitConverged(ctx context.Context, pool *pgxpool.Pool, dest Destination, w Where) (Progress, error) {
	var last Progress
	var lastErr error
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err := GetProgress(qctx, pool, dest, w)
		cancel()
		if err == nil {
			last = p
			if p.Converged() {
				return p, nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("not converged: %s (last error %v): %w", last, lastErr, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// want is what the client committed for one order.
type want struct {
	customer  string
	key       string
	items     []orderevents.Item
	cancelled bool
}

// committedOrders returns the orders the ledger's commands committed.
func committedOrders(cmds []Command) map[string]*want {
	out := map[string]*want{}
	for _, c := range cmds {
		if (c.Kind == Create || c.Kind == Rollback) && c.Outcome == Committed {
			out[c.OrderID] = &want{customer: c.CustomerID, key: c.Key, items: c.Items}
		}
	}
	for _, c := range cmds {
		if c.Kind == Cancel && c.Outcome == Committed && out[c.OrderID] != nil {
			out[c.OrderID].cancelled = true
		}
	}
	return out
}

// checkEffects is I4 on the business tables: the reserved stock per SKU is
// the committed, not cancelled orders' quantities, and each committed order
// has its reservations, released when it was cancelled.
func checkEffects(ctx context.Context, pool *pgxpool.Pool, w Where, committed map[string]*want, r *Report) error {
	wantStock := map[string]int64{}
	type resKey struct{ order, sku string }
	wantRes := map[resKey]int{}
	for id, o := range committed {
		for _, it := range o.items {
			wantRes[resKey{id, it.SKU}] = it.Quantity
			if !o.cancelled {
				wantStock[it.SKU] += int64(it.Quantity)
			}
		}
	}
	gotStock := map[string]int64{}
	rows, err := pool.Query(ctx, `SELECT sku, reserved FROM `+w.table("inventory_stock"))
	if err != nil {
		return err
	}
	var sku string
	var reserved int64
	if _, err := pgx.ForEachRow(rows, []any{&sku, &reserved}, func() error { gotStock[sku] = reserved; return nil }); err != nil {
		return err
	}
	var skus []string
	for s := range wantStock {
		skus = append(skus, s)
	}
	for s := range gotStock {
		if _, ok := wantStock[s]; !ok {
			skus = append(skus, s)
		}
	}
	sort.Strings(skus)
	for _, s := range skus {
		if gotStock[s] != wantStock[s] {
			r.Violate("I4", "%s: %d reserved, the committed orders want %d", s, gotStock[s], wantStock[s])
		}
	}
	rows, err = pool.Query(ctx, `SELECT order_id, sku, quantity, status FROM `+w.table("inventory_reservations"))
	if err != nil {
		return err
	}
	var qty int
	var rstatus string
	var oid string
	if _, err := pgx.ForEachRow(rows, []any{&oid, &sku, &qty, &rstatus}, func() error {
		k := resKey{oid, sku}
		want, ok := wantRes[k]
		delete(wantRes, k)
		o := committed[oid]
		switch {
		case !ok || o == nil:
			r.Violate("I4", "reservation of %s for order %s, which the client did not commit with it", sku, oid)
		case qty != want:
			r.Violate("I4", "reservation of %s for order %s: quantity %d, ordered %d", sku, oid, qty, want)
		case (rstatus == "released") != o.cancelled:
			r.Violate("I4", "reservation of %s for order %s is %s, order cancelled: %v", sku, oid, rstatus, o.cancelled)
		}
		return nil
	}); err != nil {
		return err
	}
	for k := range wantRes {
		r.Violate("I4", "no reservation of %s for order %s", k.sku, k.order)
	}

	return nil
}

// CheckAfterCleanup checks what must hold once clean-up has deleted settled
// events and inbox rows: every remaining event is published and applied,
// the effects match the ledger's committed orders (I4), and each order's
// inbox high-water mark is its last sequence ever handed out (I5: clean-up
// never lets a sequence be reused or an old event be applied again).
func CheckAfterCleanup(ctx context.Context, pool *pgxpool.Pool, w Where, ledger *Ledger) (*Report, error) {
	w = w.withDefaults()
	r := newReport()
	var unpublished, unapplied int
	if err := pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+w.table("outbox_events")+` WHERE published_at IS NULL),
	(SELECT count(*) FROM `+w.table("outbox_events")+` e WHERE NOT EXISTS (SELECT 1 FROM `+w.table("processed_events")+` p
		WHERE p.consumer_name = $1 AND p.event_id = e.event_id))`, w.InboxConsumer).Scan(&unpublished, &unapplied); err != nil {
		return nil, err
	}
	if unpublished > 0 {
		r.Violate("I3", "%d events not published", unpublished)
	}
	if unapplied > 0 {
		r.Violate("I4", "%d remaining events not applied", unapplied)
	}
	if err := checkEffects(ctx, pool, w, committedOrders(ledger.Commands()), r); err != nil {
		return nil, err
	}
	var behind int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+w.table("outbox_aggregates")+` a
LEFT JOIN `+w.table("inbox_aggregates")+` m
	ON m.consumer_name = $1 AND m.aggregate_type = a.aggregate_type AND m.aggregate_id = a.aggregate_id
WHERE coalesce(m.last_sequence, 0) <> greatest(a.last_sequence, (SELECT max(e.aggregate_sequence) FROM `+w.table("outbox_events")+` e
	WHERE e.aggregate_type = a.aggregate_type AND e.aggregate_id = a.aggregate_id))`, w.InboxConsumer).Scan(&behind); err != nil {
		return nil, err
	}
	if behind > 0 {
		r.Violate("I5", "%d orders whose inbox high-water mark is not their last sequence", behind)
	}
	return r, nil
}

type eventRow struct {
	id        uuid.UUID
	orderID   string
	seq       int64
	typ       string
	customer  string
	published bool
	quarant   bool
}

// Check verifies I1-I5 and request idempotency on the final state of
// PostgreSQL and the destination against the client's ledger (resolve it
// first).
// outOfOrder is the number of applications out of order the consumers
// reported (their "cancellation found no reservation" anomaly).
func Check(ctx context.Context, pool *pgxpool.Pool, dest Destination, w Where, ledger *Ledger, outOfOrder int) (*Report, error) {
	w = w.withDefaults()
	r := newReport()
	r.Destination = dest.Name()
	cmds := ledger.Commands()
	answers, idem := ledger.Problems()
	for _, p := range answers {
		r.Violate("responses", "%s", p)
	}
	for _, p := range idem {
		r.Violate("idempotency", "%s", p)
	}

	// The client's truth.
	committed := map[string]*want{} // order id -> what the client committed
	byCustomer := map[string]string{}
	var notCommitted []Command
	for _, c := range cmds {
		r.Commands++
		r.Requests += c.Requests
		r.Replays += c.Replays
		r.KeyReusesRefused += c.KeyReusesRefused
		if c.AmbiguousAttempts > 0 {
			r.Ambiguous++
		}
		if c.ResolvedByDB {
			r.ResolvedByDB++
		}
		switch c.Outcome {
		case NotSent:
			r.NotSent++
		case RolledBack:
			r.Rollbacks++
		case Refused:
			r.Refused++
		case Ambiguous:
			r.Violate("responses", "command %d (%s) was never resolved", c.Seq, c.Kind)
		case Committed:
			r.Commits++
		}
		switch {
		case (c.Kind == Create || c.Kind == Rollback) && c.Outcome == Committed:
			r.CreatesCommitted++
			if prev, dup := committed[c.OrderID]; dup {
				r.Violate("idempotency", "order %s returned to two commands (%s and %s)", c.OrderID, prev.customer, c.CustomerID)
			}
			committed[c.OrderID] = &want{customer: c.CustomerID, key: c.Key, items: c.Items}
			byCustomer[c.CustomerID] = c.OrderID
			if c.Kind == Rollback {
				r.Violate("I2", "command %d named an unknown SKU and committed order %s", c.Seq, c.OrderID)
			}
		case c.Kind == Create || c.Kind == Rollback:
			notCommitted = append(notCommitted, c)
		}
	}
	for _, c := range cmds {
		if c.Kind == Cancel && c.Outcome == Committed {
			r.CancelsCommitted++
			if o := committed[c.OrderID]; o != nil {
				o.cancelled = true
			} else {
				r.Violate("responses", "command %d cancelled order %s the client never saw committed", c.Seq, c.OrderID)
			}
		}
	}

	// The database.
	type orderRow struct{ customer, status string }
	orders := map[string]orderRow{}
	customers := map[string][]string{}
	rows, err := pool.Query(ctx, `SELECT order_id, customer_id, status FROM `+w.table("orders"))
	if err != nil {
		return nil, err
	}
	var oid, cust, status string
	if _, err := pgx.ForEachRow(rows, []any{&oid, &cust, &status}, func() error {
		orders[oid] = orderRow{cust, status}
		customers[cust] = append(customers[cust], oid)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	var events []eventRow
	rows, err = pool.Query(ctx, `SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
	coalesce(convert_from(payload_bytes, 'UTF8')::jsonb->>'customer_id', ''), published_at IS NOT NULL, quarantined_at IS NOT NULL
FROM `+w.table("outbox_events")+` ORDER BY aggregate_id, aggregate_sequence`)
	if err != nil {
		return nil, err
	}
	var e eventRow
	var aggType string
	if _, err := pgx.ForEachRow(rows, []any{&e.id, &aggType, &e.orderID, &e.seq, &e.typ, &e.customer, &e.published, &e.quarant}, func() error {
		if aggType != orderevents.AggregateType {
			if w.Saga && (aggType == orderevents.InventoryAggregateType || aggType == orderevents.PaymentAggregateType) {
				// The saga's events: CheckSaga checks them; counted here.
				r.SagaEvents++
				if e.published {
					r.SagaPublished++
				}
				return nil
			}
			r.Violate("I2", "event %s of unknown aggregate type %q", e.id, aggType)
			return nil
		}
		events = append(events, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	r.Events = int64(len(events))
	eventsOf := map[string][]eventRow{}
	eventsOfCustomer := map[string]int{}
	for _, e := range events {
		eventsOf[e.orderID] = append(eventsOf[e.orderID], e)
		if e.typ == orderevents.OrderCreated {
			eventsOfCustomer[e.customer]++
		}
		if e.published {
			r.Published++
		}
	}

	// I1: each committed command has exactly one intent.
	for id, o := range committed {
		row, ok := orders[id]
		if !ok {
			r.Violate("I1", "order %s (%s) committed per the API but not in the table", id, o.customer)
			continue
		}
		var created, cancelled int
		for _, e := range eventsOf[id] {
			switch e.typ {
			case orderevents.OrderCreated:
				created++
			case orderevents.OrderCancelled:
				cancelled++
			}
		}
		wantCancel := 0
		if o.cancelled {
			wantCancel = 1
		}
		if created != 1 || cancelled != wantCancel {
			r.Violate("I1", "order %s: %d OrderCreated and %d OrderCancelled intents, want 1 and %d", id, created, cancelled, wantCancel)
		}
		if (row.status == "cancelled") != o.cancelled {
			r.Violate("I1", "order %s is %s, the client's cancellation committed: %v", id, row.status, o.cancelled)
		}
	}

	// I2: nothing for commands that did not commit, nothing the client did not commit.
	for _, c := range notCommitted {
		if n := len(customers[c.CustomerID]); n > 0 {
			r.Violate("I2", "command %d (%s, outcome %d) did not commit but left %d order(s)", c.Seq, c.Kind, c.Outcome, n)
		}
		if n := eventsOfCustomer[c.CustomerID]; n > 0 {
			r.Violate("I2", "command %d (%s) did not commit but left %d OrderCreated intent(s)", c.Seq, c.Kind, n)
		}
	}
	for id := range orders {
		if committed[id] == nil {
			r.Violate("I2", "order %s (%s) is in the table but no command committed it", id, orders[id].customer)
		}
	}
	for id, evs := range eventsOf {
		if committed[id] == nil {
			r.Violate("I2", "%d intent(s) for order %s that no command committed", len(evs), id)
		}
	}
	if want := int64(r.CreatesCommitted + r.CancelsCommitted); r.Events != want {
		r.Violate("I2", "%d intents for %d committed commands", r.Events, want)
	}

	// I3: every intent published and at the broker.
	msgs, err := dest.Messages(ctx)
	if err != nil {
		return nil, err
	}
	r.StreamMessages = int64(len(msgs))
	inStream := map[uuid.UUID]int{}
	for _, m := range msgs {
		inStream[m.ID]++
	}
	r.DuplicatesPublished = int64(len(msgs) - len(inStream))
	for _, e := range events {
		switch {
		case e.quarant:
			r.Violate("I3", "event %s (order %s seq %d) is quarantined", e.id, e.orderID, e.seq)
		case !e.published:
			r.Violate("I3", "event %s (order %s seq %d) is not published", e.id, e.orderID, e.seq)
		}
		if inStream[e.id] == 0 {
			r.Violate("I3", "event %s (order %s seq %d, marked published: %v) is not at the destination", e.id, e.orderID, e.seq, e.published)
		}
	}

	// I5 at the broker: per order, the first publication of each sequence
	// comes in order, without a gap. (A stale relay may repeat an old event
	// later: a duplicate, which the consumer's inbox drops.)
	DeliveryOrder(msgs, nil, r.Violate)

	// I4: each event applied once; stock and reservations match the orders.
	processed := map[uuid.UUID]bool{}
	rows, err = pool.Query(ctx, `SELECT event_id FROM `+w.table("processed_events")+` WHERE consumer_name = $1`, w.InboxConsumer)
	if err != nil {
		return nil, err
	}
	var pid uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&pid}, func() error { processed[pid] = true; return nil }); err != nil {
		return nil, err
	}
	for _, e := range events {
		if !processed[e.id] {
			r.Violate("I4", "event %s (order %s seq %d) was never applied", e.id, e.orderID, e.seq)
		}
		delete(processed, e.id)
	}
	for id := range processed {
		r.Violate("I4", "inbox row for event %s, which is not in the outbox", id)
	}
	if err := checkEffects(ctx, pool, w, committed, r); err != nil {
		return nil, err
	}

	// I5 at the consumer: the high-water mark of every order is its last
	// sequence, and no consumer applied a cancellation before its creation.
	marks := map[string]int64{}
	rows, err = pool.Query(ctx, `SELECT aggregate_id, last_sequence FROM `+w.table("inbox_aggregates")+`
WHERE consumer_name = $1 AND aggregate_type = $2`, w.InboxConsumer, orderevents.AggregateType)
	if err != nil {
		return nil, err
	}
	var mark int64
	if _, err := pgx.ForEachRow(rows, []any{&oid, &mark}, func() error { marks[oid] = mark; return nil }); err != nil {
		return nil, err
	}
	for id, evs := range eventsOf {
		if last := evs[len(evs)-1].seq; marks[id] != last {
			r.Violate("I5", "order %s: the inbox high-water mark is %d, its last sequence %d", id, marks[id], last)
		}
		for i, e := range evs {
			if e.seq != int64(i+1) {
				r.Violate("I5", "order %s: sequence %d where %d was due", id, e.seq, i+1)
				break
			}
		}
	}
	if outOfOrder > 0 {
		r.Violate("I5", "consumers applied %d cancellations before their order's creation", outOfOrder)
	}

	// Request idempotency: one order per key and per customer (each logical
	// command, with all its retries, has its own customer id).
	keys := map[string]string{}
	rows, err = pool.Query(ctx, `SELECT idempotency_key, order_id FROM `+w.table("order_idempotency_keys"))
	if err != nil {
		return nil, err
	}
	var key string
	if _, err := pgx.ForEachRow(rows, []any{&key, &oid}, func() error { keys[key] = oid; return nil }); err != nil {
		return nil, err
	}
	for cust, ids := range customers {
		if len(ids) > 1 {
			r.Violate("idempotency", "customer %s (one command) has %d orders: %v", cust, len(ids), ids)
		}
	}
	for id, o := range committed {
		if o.key != "" && keys[o.key] != id {
			r.Violate("idempotency", "key %s maps to order %q, the client got %s", o.key, keys[o.key], id)
		}
	}

	p, err := GetProgress(ctx, pool, dest, w)
	if err != nil {
		return nil, err
	}
	r.Deliveries = p.Deliveries
	if p.Deliveries >= 0 {
		r.DuplicatesDelivered = max(p.Deliveries-r.Events, 0)
	} else {
		r.DuplicatesDelivered = -1
	}
	return r, nil
}
