package ordersapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Saga states (order_sagas.state). docs/saga.md has the state machine.
const (
	// SagaStarted: the order is placed; inventory has not answered yet.
	SagaStarted = "started"
	// SagaStockReserved: the stock is reserved; payments has not answered.
	SagaStockReserved = "stock_reserved"
	// SagaConfirmed: paid; the order is confirmed (terminal).
	SagaConfirmed = "confirmed"
	// SagaCancelled: the order is cancelled, by the customer or by the saga
	// (stock rejected, payment failed); its stock is released and a charge
	// refunded by the consumers (terminal unless the refund fails).
	SagaCancelled = "cancelled"
	// SagaNeedsAttention: a compensation failed (the provider refused the
	// refund of a cancelled order's charge), or its outcome is unknown past
	// its retries: parked with the reason. An unknown refund is settled by
	// payments once the side-effect helper learns the outcome (refunded:
	// the saga ends cancelled); a failed one by an operator, with
	// ResolveSaga (terminal until resolved).
	SagaNeedsAttention = "needs_attention"
)

// ReasonCustomer is the cancel reason of a cancellation through the API.
const ReasonCustomer = "customer"

// Saga is an order's saga as GET /orders/{id} shows it.
type Saga struct {
	State     string     `json:"state"`
	Reason    string     `json:"reason,omitempty"`
	UpdatedAt time.Time  `json:"updated_at"`
	Steps     []SagaStep `json:"steps"`
}

// SagaStep is one entry of a saga's history.
type SagaStep struct {
	// Step names what happened: "order created", an event type, "cancelled",
	// "resolved".
	Step string `json:"step"`
	// State is the saga's state after the step.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Actor is who resolved a parked saga (operator resolutions only).
	Actor   string    `json:"actor,omitempty"`
	EventID string    `json:"event_id,omitempty"`
	At      time.Time `json:"at"`
}

type sagaQueries struct {
	start, step, setState, get, steps, confirm, counts, parked, lockOrder string
}

func newSagaQueries(app pgident.Schema) sagaQueries {
	sagas, steps, orders := app.Table("order_sagas"), app.Table("order_saga_steps"), app.Table("orders")
	return sagaQueries{
		start: `INSERT INTO ` + sagas + ` (order_id, state) VALUES ($1, 'started') ON CONFLICT (order_id) DO NOTHING`,
		step:  `INSERT INTO ` + steps + ` (order_id, step, state, reason, actor, event_id) VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''), $6)`,
		// $3 true: the state is needs_attention, stamped now.
		setState: `UPDATE ` + sagas + ` SET state = $2, reason = NULLIF($4, ''), updated_at = now(),
attention_since = CASE WHEN $3 THEN now() ELSE NULL END WHERE order_id = $1`,
		get:     `SELECT state, coalesce(reason, ''), updated_at FROM ` + sagas + ` WHERE order_id = $1`,
		steps:   `SELECT step, state, coalesce(reason, ''), coalesce(actor, ''), coalesce(event_id::text, ''), at FROM ` + steps + ` WHERE order_id = $1 ORDER BY seq`,
		confirm: `UPDATE ` + orders + ` SET status = 'confirmed', confirmed_at = now() WHERE order_id = $1 AND status = 'created'`,
		counts:  `SELECT state, count(*) FROM ` + sagas + ` GROUP BY state`,
		// The order row is locked before the saga row, as Cancel does.
		lockOrder: `SELECT 1 FROM ` + orders + ` WHERE order_id = $1 FOR UPDATE`,
		parked: `SELECT order_id, coalesce(reason, ''), attention_since FROM ` + sagas + `
WHERE state = 'needs_attention' ORDER BY attention_since LIMIT $1`,
	}
}

func (s *Service) sagaStart(ctx context.Context, tx pgx.Tx, orderID string) error {
	if _, err := tx.Exec(ctx, s.q.saga.start, orderID); err != nil {
		return fmt.Errorf("start saga: %w", err)
	}
	return s.sagaStep(ctx, tx, orderID, "order created", SagaStarted, "", "", nil, false)
}

// sagaStep appends a step and, when set, moves the saga to state.
func (s *Service) sagaStep(ctx context.Context, tx pgx.Tx, orderID, step, state, reason, actor string, eventID *uuid.UUID, set bool) error {
	if set {
		if _, err := tx.Exec(ctx, s.q.saga.setState, orderID, state, state == SagaNeedsAttention, reason); err != nil {
			return fmt.Errorf("saga state: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, s.q.saga.step, orderID, step, state, reason, actor, eventID); err != nil {
		return fmt.Errorf("saga step: %w", err)
	}
	return nil
}

func (s *Service) sagaState(ctx context.Context, tx pgx.Tx, orderID string) (string, error) {
	var state, reason string
	var at time.Time
	err := tx.QueryRow(ctx, s.q.saga.get+" FOR UPDATE", orderID).Scan(&state, &reason, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil // an order placed before the saga existed
	}
	return state, err
}

// cancelTx cancels the order in tx with reason and records OrderCancelled;
// false when the order is not cancellable (missing, or cancelled already).
func (s *Service) cancelTx(ctx context.Context, tx pgx.Tx, orderID, reason string, cause *uuid.UUID) (bool, error) {
	var customerID string
	var cancelledAt time.Time
	err := tx.QueryRow(ctx, s.q.cancel, orderID, reason).Scan(&customerID, &cancelledAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	payload, err := json.Marshal(orderevents.OrderCancelledPayload{
		OrderID: orderID, CustomerID: customerID, CancelledAt: cancelledAt.UTC(), Reason: reason})
	if err != nil {
		return false, err
	}
	if err = s.events.record(ctx, tx, outbox.Event{
		AggregateType: orderevents.AggregateType, AggregateID: orderID,
		Type: orderevents.OrderCancelled, Payload: payload,
	}); err != nil {
		return false, err
	}
	state, err := s.sagaState(ctx, tx, orderID)
	if err != nil || state == "" {
		return true, err
	}
	return true, s.sagaStep(ctx, tx, orderID, "cancelled", SagaCancelled, reason, "", cause, state != SagaNeedsAttention)
}

// ApplySagaEvent is the order service's step of the saga for one event of
// inventory or payments, inside the consumer's inbox transaction tx: it
// confirms the order (PaymentCaptured), cancels it with a reason and
// records OrderCancelled (StockRejected, PaymentFailed), records the
// progress (StockReserved, PaymentRefunded), or parks the saga as
// needs_attention (RefundFailed; RefundUnknown until payments learns the
// refund's outcome: a PaymentRefunded then ends the saga cancelled). Other
// events change nothing.
func (s *Service) ApplySagaEvent(ctx context.Context, tx pgx.Tx, msg outbox.Message) error {
	orderID, id := msg.AggregateID, msg.ID
	if _, err := tx.Exec(ctx, s.q.saga.lockOrder, orderID); err != nil {
		return fmt.Errorf("lock order: %w", err)
	}
	state, err := s.sagaState(ctx, tx, orderID)
	if err != nil {
		return err
	}
	if state == "" {
		return nil // not a saga order
	}
	switch msg.Type {
	case orderevents.StockReserved:
		set := state == SagaStarted
		next := state
		if set {
			next = SagaStockReserved
		}
		return s.sagaStep(ctx, tx, orderID, msg.Type, next, "", "", &id, set)
	case orderevents.StockRejected:
		var p orderevents.StockPayload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return fmt.Errorf("decode %s payload: %w", msg.Type, err)
		}
		return s.compensate(ctx, tx, msg, state, "stock rejected: "+p.Reason)
	case orderevents.PaymentFailed:
		var p orderevents.PaymentPayload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return fmt.Errorf("decode %s payload: %w", msg.Type, err)
		}
		return s.compensate(ctx, tx, msg, state, "payment failed: "+p.Reason)
	case orderevents.PaymentCaptured:
		tag, err := tx.Exec(ctx, s.q.saga.confirm, orderID)
		if err != nil {
			return fmt.Errorf("confirm order: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return s.sagaStep(ctx, tx, orderID, msg.Type, SagaConfirmed, "", "", &id, true)
		}
		// Cancelled while the charge was made: payments refunds it when it
		// sees the OrderCancelled.
		return s.sagaStep(ctx, tx, orderID, msg.Type, state, "captured after the cancellation; refund due", "", &id, false)
	case orderevents.PaymentRefunded:
		if state == SagaNeedsAttention {
			// Parked while the refund's outcome was unknown: it happened,
			// the compensation is done.
			return s.sagaStep(ctx, tx, orderID, msg.Type, SagaCancelled, "refund outcome learnt: refunded", "", &id, true)
		}
		return s.sagaStep(ctx, tx, orderID, msg.Type, state, "", "", &id, false)
	case orderevents.RefundFailed, orderevents.RefundUnknown:
		var p orderevents.PaymentPayload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return fmt.Errorf("decode %s payload: %w", msg.Type, err)
		}
		reason := "refund failed: " + p.Reason
		if msg.Type == orderevents.RefundUnknown {
			reason = "refund outcome unknown: " + p.Reason
		}
		return s.sagaStep(ctx, tx, orderID, msg.Type, SagaNeedsAttention, reason, "", &id, true)
	}
	return nil
}

// compensate cancels the order for a failed forward step.
func (s *Service) compensate(ctx context.Context, tx pgx.Tx, msg outbox.Message, state, reason string) error {
	id := msg.ID
	done, err := s.cancelTx(ctx, tx, msg.AggregateID, reason, &id)
	if err != nil {
		return fmt.Errorf("cancel order: %w", err)
	}
	if !done { // cancelled before (by the customer): record the event only
		return s.sagaStep(ctx, tx, msg.AggregateID, msg.Type, state, reason, "", &id, false)
	}
	return nil
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Saga returns the order's saga, or nil when the order has none.
func (s *Service) Saga(ctx context.Context, orderID string) (*Saga, error) {
	return s.saga(ctx, s.pool, orderID)
}

func (s *Service) saga(ctx context.Context, db querier, orderID string) (*Saga, error) {
	var sg Saga
	err := db.QueryRow(ctx, s.q.saga.get, orderID).Scan(&sg.State, &sg.Reason, &sg.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read saga: %w", err)
	}
	sg.UpdatedAt = sg.UpdatedAt.UTC()
	rows, err := db.Query(ctx, s.q.saga.steps, orderID)
	if err != nil {
		return nil, fmt.Errorf("read saga steps: %w", err)
	}
	sg.Steps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (SagaStep, error) {
		var st SagaStep
		err := r.Scan(&st.Step, &st.State, &st.Reason, &st.Actor, &st.EventID, &st.At)
		st.At = st.At.UTC()
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("read saga steps: %w", err)
	}
	return &sg, nil
}

// SagaCounts returns how many sagas are in each state.
func (s *Service) SagaCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, s.q.saga.counts)
	if err != nil {
		return nil, fmt.Errorf("count sagas: %w", err)
	}
	out := map[string]int64{}
	var state string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error { out[state] = n; return nil })
	return out, err
}

// ErrNotNeedingAttention: ResolveSaga was asked to resolve a saga that is
// not parked as needs_attention.
var ErrNotNeedingAttention = errors.New("the saga does not need attention")

// ResolveSaga settles a saga parked as needs_attention as SagaCancelled or
// SagaConfirmed, recording who (by) and why (reason) as a step. It changes
// the saga only: what the operator did outside (a manual refund) is theirs
// to record in reason.
func (s *Service) ResolveSaga(ctx context.Context, orderID, as, reason, by string) (*Saga, error) {
	if as != SagaCancelled && as != SagaConfirmed {
		return nil, fmt.Errorf("resolve as %q: want %s or %s", as, SagaCancelled, SagaConfirmed)
	}
	if reason == "" || by == "" {
		return nil, errors.New("resolve needs a reason and who resolves (--reason, --by)")
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		state, err := s.sagaState(ctx, tx, orderID)
		if err != nil {
			return err
		}
		if state != SagaNeedsAttention {
			if state == "" {
				state = "absent"
			}
			return fmt.Errorf("order %s: %w (state %s)", orderID, ErrNotNeedingAttention, state)
		}
		return s.sagaStep(ctx, tx, orderID, "resolved", as, reason, by, nil, true)
	})
	if err != nil {
		return nil, err
	}
	return s.Saga(ctx, orderID)
}

// Parked is a saga needing attention.
type Parked struct {
	OrderID string
	Reason  string
	Since   time.Time
}

// SagasNeedingAttention lists up to limit sagas parked as needs_attention,
// oldest first.
func (s *Service) SagasNeedingAttention(ctx context.Context, limit int) ([]Parked, error) {
	rows, err := s.pool.Query(ctx, s.q.saga.parked, limit)
	if err != nil {
		return nil, fmt.Errorf("list sagas needing attention: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		err := r.Scan(&p.OrderID, &p.Reason, &p.Since)
		p.Since = p.Since.UTC()
		return p, err
	})
}
