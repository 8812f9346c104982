package chaos

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/examples/orders/provider"
)

// The saga's invariants, checked by CheckSaga when the saga runs.
func init() {
	Descriptions["I6"] = "no order charged more than once at the provider (its ledger is the witness)"
	Descriptions["I7"] = "every order terminal: confirmed, stock reserved, one capture; or cancelled, stock released, no net charge; or parked with a reason"
}

// SagaFigures are the saga's counts in a report.
type SagaFigures struct {
	// Mode is the provider's mode; in mode neither I6 is not checked but
	// DuplicateCharges reported.
	Mode                                          provider.Mode
	Orders, Confirmed, Cancelled, Parked, Pending int
	// Charges and Refunds are the provider's ledger entries (money moved).
	Charges, Refunds int
	// DuplicateCharges counts captured charges beyond the first of an order.
	DuplicateCharges int
	// Ambiguous counts the helper's calls whose outcome was unknown at some
	// point; ResolvedByLookup and ResolvedByCall how those ended (a lookup,
	// or a retry with the same key); ParkedCalls are still parked;
	// BlindRetries are mode neither's calls made again without knowing.
	Ambiguous, ResolvedByLookup, ResolvedByCall, ParkedCalls, BlindRetries int
	// RelaxedI7: I7 was checked in its relaxed form (mode neither with
	// Where.BlindRetry): a confirmed order may have been captured more
	// than once, and a cancelled one may keep a duplicate capture after a
	// refund. Without blind retries mode neither parks unknown outcomes
	// instead, and I7 is checked as in the other modes.
	RelaxedI7 bool
}

// i7Relaxed describes I7 in its relaxed form, on its line of the report.
const i7Relaxed = "RELAXED for blind retries (mode neither, --blind-retry): every order terminal: confirmed, stock reserved, one capture or more (duplicates counted above); or cancelled, stock released, no net charge or refunded once after duplicate captures; or parked with a reason"

// invariants are the report's invariants in order: I6 and I7 after I5 when
// the saga was checked. In mode neither I6 is not checked, so it gets no
// "violations" line: the duplicate charges figure stands in its place.
func (r *Report) invariants() []string {
	if r.Saga == nil {
		return Invariants
	}
	out := append([]string(nil), Invariants[:5]...)
	if r.Saga.Mode != provider.ModeNeither {
		out = append(out, "I6")
	}
	out = append(out, "I7")
	return append(out, Invariants[5:]...)
}

// CheckSaga adds I6 and I7 and the saga's figures to r, from the order
// service's, inventory's and payments' tables in w.Schema and the
// provider's ledger.
func CheckSaga(ctx context.Context, pool *pgxpool.Pool, w Where, ledger provider.Ledger, mode provider.Mode, r *Report) error {
	f, problems, err := sagaState(ctx, pool, w, ledger, mode)
	if err != nil {
		return err
	}
	r.Saga = f
	for _, p := range problems {
		r.Violate(p.inv, "%s", p.text)
	}
	return nil
}

type sagaProblem struct{ inv, text string }

func sagaState(ctx context.Context, pool *pgxpool.Pool, w Where, ledger provider.Ledger, mode provider.Mode) (*SagaFigures, []sagaProblem, error) {
	w = w.withDefaults()
	relaxed := mode == provider.ModeNeither && w.BlindRetry
	f := &SagaFigures{Mode: mode, RelaxedI7: relaxed}
	var problems []sagaProblem
	bad := func(inv, format string, args ...any) {
		problems = append(problems, sagaProblem{inv, fmt.Sprintf(format, args...)})
	}
	totals := map[string]provider.LedgerTotal{}
	for _, t := range ledger.Totals {
		totals[t.Reference] = t
	}
	for _, e := range ledger.Entries {
		switch e.Kind {
		case "charge":
			f.Charges++
		case "refund":
			f.Refunds++
		}
	}
	// Calls parked for an operator, by key: their order is parked too.
	parkedCalls := map[string]string{}
	prow, err := pool.Query(ctx, `SELECT key, coalesce(park_reason, '') FROM `+w.table("side_effects")+` WHERE state = 'parked' AND name IN ($1, $2)`,
		payments.ChargeName, payments.RefundName)
	if err != nil {
		return nil, nil, fmt.Errorf("read side effects: %w", err)
	}
	var pk, pr string
	if _, err := pgx.ForEachRow(prow, []any{&pk, &pr}, func() error { parkedCalls[pk] = pr; return nil }); err != nil {
		return nil, nil, fmt.Errorf("read side effects: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT o.order_id, o.status, coalesce(s.state, ''), coalesce(s.reason, ''),
	(SELECT count(*) FROM `+w.table("inventory_reservations")+` r WHERE r.order_id = o.order_id AND r.status = 'reserved'),
	(SELECT count(*) FROM `+w.table("order_items")+` i WHERE i.order_id = o.order_id)
FROM `+w.table("orders")+` o LEFT JOIN `+w.table("order_sagas")+` s USING (order_id) ORDER BY o.order_id`)
	if err != nil {
		return nil, nil, fmt.Errorf("read sagas: %w", err)
	}
	var id, status, state, reason string
	var reserved, items int
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &state, &reason, &reserved, &items}, func() error {
		f.Orders++
		t := totals[payments.ChargeKey(id)]
		if t.Charges > 1 {
			f.DuplicateCharges += t.Charges - 1
			if mode != provider.ModeNeither {
				bad("I6", "order %s charged %d times (%d captured)", id, t.Charges, t.Captured)
			}
		}
		if state != ordersapi.SagaNeedsAttention {
			for _, k := range []string{payments.ChargeKey(id), payments.RefundKey(id)} {
				if why, ok := parkedCalls[k]; ok {
					state, reason = ordersapi.SagaNeedsAttention, "call "+k+" parked: "+why
				}
			}
		}
		oneCapture := t.Charges == 1 || (relaxed && t.Charges > 1)
		switch state {
		case ordersapi.SagaConfirmed:
			f.Confirmed++
			if status != ordersapi.StatusConfirmed || reserved != items || !oneCapture || t.Net <= 0 {
				bad("I7", "order %s confirmed but: status %s, %d of %d items reserved, %d captures, net %d", id, status, reserved, items, t.Charges, t.Net)
			}
		case ordersapi.SagaCancelled:
			f.Cancelled++
			// Blind retries may have charged twice and refunded once.
			noNet := t.Net == 0 || (relaxed && t.Charges > 1 && t.Refunds > 0)
			if status != ordersapi.StatusCancelled || reserved != 0 || !noNet {
				bad("I7", "order %s cancelled but: status %s, %d items still reserved, net charge %d (%d captures, %d refunds)", id, status, reserved, t.Net, t.Charges, t.Refunds)
			}
		case ordersapi.SagaNeedsAttention:
			f.Parked++
			if reason == "" {
				bad("I7", "order %s parked without a reason", id)
			}
		default:
			f.Pending++
			bad("I7", "order %s not terminal: saga %q, order %s", id, state, status)
		}
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("read sagas: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT
	count(*) FILTER (WHERE unknown_since IS NOT NULL),
	count(*) FILTER (WHERE unknown_since IS NOT NULL AND resolved_via = 'lookup'),
	count(*) FILTER (WHERE unknown_since IS NOT NULL AND resolved_via = 'call'),
	count(*) FILTER (WHERE state = 'parked'),
	coalesce(sum(blind_retries), 0)
FROM `+w.table("side_effects")+` WHERE name IN ($1, $2)`, payments.ChargeName, payments.RefundName).
		Scan(&f.Ambiguous, &f.ResolvedByLookup, &f.ResolvedByCall, &f.ParkedCalls, &f.BlindRetries); err != nil {
		return nil, nil, fmt.Errorf("read side effects: %w", err)
	}
	return f, problems, nil
}

// WaitSagaSettled polls until every order's saga satisfies I7 (the I6
// violations, if any, stay) and the relay has published every saga event,
// or ctx ends; ledger reads the provider's
// ledger. It returns the last figures.
func WaitSagaSettled(ctx context.Context, pool *pgxpool.Pool, w Where, ledger func(context.Context) (provider.Ledger, error), mode provider.Mode) (*SagaFigures, error) {
	var last *SagaFigures
	var lastErr error
	lastProblem := ""
	for {
		l, err := ledger(ctx)
		if err == nil {
			var problems []sagaProblem
			last, problems, err = sagaState(ctx, pool, w, l, mode)
			if err == nil {
				settled := true
				for _, p := range problems {
					if p.inv == "I7" {
						settled, lastProblem = false, p.text
						break
					}
				}
				if settled {
					// The saga's last steps write events too (a refund's,
					// a release's): settled means the relay has published
					// them, so that the report's figures (relay = order +
					// saga events) and I3 are read on a quiet outbox.
					var unpublished int64
					if err = pool.QueryRow(ctx, `SELECT count(*) FROM `+w.table("outbox_events")+`
WHERE aggregate_type IN ($1, $2) AND published_at IS NULL AND quarantined_at IS NULL`,
						orderevents.InventoryAggregateType, orderevents.PaymentAggregateType).Scan(&unpublished); err == nil {
						if unpublished == 0 {
							return last, nil
						}
						lastProblem = fmt.Sprintf("%d saga events not yet published", unpublished)
					}
				}
			}
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("sagas not settled: %s (last error %v): %w", lastProblem, lastErr, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WriteSaga writes the saga's figures, one a line.
func (r *Report) WriteSaga(w io.Writer) {
	f := r.Saga
	if f == nil {
		return
	}
	Line(w, "saga orders", f.Orders, fmt.Sprintf("%d confirmed, %d cancelled, %d parked (needs attention), %d not terminal", f.Confirmed, f.Cancelled, f.Parked, f.Pending))
	Line(w, "provider charges", f.Charges, fmt.Sprintf("captured, in the provider's ledger (mode %s)", f.Mode))
	Line(w, "provider refunds", f.Refunds, "compensations of cancelled orders' charges")
	Line(w, "ambiguous calls", f.Ambiguous, fmt.Sprintf("outcome unknown at first; %d resolved by lookup, %d by a retry with the same key, %d parked", f.ResolvedByLookup, f.ResolvedByCall, f.ParkedCalls))
	switch {
	case f.Mode == provider.ModeNeither && f.RelaxedI7:
		Line(w, "duplicate charges", f.DuplicateCharges, fmt.Sprintf("mode neither with blind retries: a figure, not a check (%d blind retries)", f.BlindRetries))
	case f.Mode == provider.ModeNeither:
		Line(w, "duplicate charges", f.DuplicateCharges, fmt.Sprintf("mode neither: a figure, not a check; no blind retry: unknown outcomes parked for an operator (%d parked calls)", f.ParkedCalls))
	}
}
