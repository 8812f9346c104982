package sideeffect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// ReconcileReport says what one ReconcileOnce did.
type ReconcileReport struct {
	// Checked counts the attempts it took up: unknown ones due for a check,
	// and started ones whose lease expired (their caller died).
	Checked int `json:"checked"`
	// Succeeded and Failed count the attempts a lookup resolved; NotFound
	// those the provider has no record of (they stay unknown: the next Do
	// calls again); LookupErrors the lookups that failed.
	Succeeded    int `json:"succeeded"`
	Failed       int `json:"failed"`
	NotFound     int `json:"not_found"`
	LookupErrors int `json:"lookup_errors"`
	// Unresolved counts attempts left unknown without a lookup (no Lookup
	// configured): they wait for their caller's next Do, or the bound.
	Unresolved int `json:"unresolved"`
	// Parked counts the attempts parked past their bound.
	Parked int `json:"parked"`
	// Deferred counts the attempts whose claim ran out before their turn
	// in the round came (slow lookups of the ones before): they were given
	// back without a lookup, due again at once.
	Deferred int `json:"deferred,omitempty"`
}

// Reconcile runs ReconcileOnce every Config.ReconcilePoll (at once again
// after a full batch) until ctx ends, and returns nil then. A failed round
// is logged and retried at the next poll. Run one per process that uses the
// Caller, or a few: they share the work (SKIP LOCKED).
func (c *Caller) Reconcile(ctx context.Context) error {
	for {
		rep, err := c.ReconcileOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			c.cfg.Logger.Warn("reconcile side effects", slog.String("name", c.cfg.Name), slog.Any("error", err))
		}
		if err == nil && rep.Checked == c.cfg.ReconcileBatch {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.cfg.ReconcilePoll):
		}
	}
}

// due is an attempt the reconciler claimed.
type due struct {
	claim
	ageSeconds float64
	retry      bool // an operator allowed the next Do to call
}

// ReconcileOnce takes up to Config.ReconcileBatch attempts of the Caller's
// name that are due for a check, and resolves each: with a Lookup, it asks
// the provider (found: Succeeded or Failed, recorded; not found or an error:
// unknown again, next check after an exponential backoff); without one, a
// started attempt whose lease expired becomes unknown (mode Neither without
// BlindRetry: parked). An attempt past its bound (Config.MaxChecks lookups,
// Config.MaxAge unknown) is parked with the reason. It never calls the
// provider's effect: only Do does, with the request.
func (c *Caller) ReconcileOnce(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	lookup := c.cfg.Lookup != nil
	addCheck := 0
	if lookup {
		addCheck = 1
	}
	sent := time.Now()
	rows, err := c.db.Query(ctx, `WITH due AS (
	SELECT name, key FROM `+c.t+`
	WHERE name = $1 AND state IN ('started', 'unknown') AND next_check_at <= now()
	ORDER BY next_check_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE `+c.t+` s SET state = 'started', lease_token = s.lease_token + 1,
	lease_until = now() + make_interval(secs => $3), next_check_at = now() + make_interval(secs => $3),
	unknown_since = coalesce(s.unknown_since, s.lease_until, now()), checks = s.checks + $4, updated_at = now()
FROM due WHERE s.name = due.name AND s.key = due.key
RETURNING s.key, s.lease_token, s.attempts, s.checks, extract(epoch FROM now() - s.unknown_since)::float8, s.operator_retry`,
		c.cfg.Name, c.cfg.ReconcileBatch, secs(c.cfg.Lease), addCheck)
	if err != nil {
		return rep, fmt.Errorf("sideeffect %s: claim attempts due for a check: %w", c.cfg.Name, err)
	}
	claimed, err := pgtx.Collect(rows, func(row pgtx.Row) (due, error) {
		d := due{claim: claim{leaseEnd: c.granted(sent)}}
		return d, row.Scan(&d.key, &d.token, &d.attempts, &d.checks, &d.ageSeconds, &d.retry)
	})
	if err != nil {
		return rep, fmt.Errorf("sideeffect %s: claim attempts due for a check: %w", c.cfg.Name, err)
	}
	rep.Checked = len(claimed)
	for _, d := range claimed {
		if err := c.reconcileOne(ctx, d, &rep); err != nil {
			return rep, fmt.Errorf("sideeffect %s, key %s: %w", c.cfg.Name, d.key, err)
		}
	}
	return rep, nil
}

func (c *Caller) reconcileOne(ctx context.Context, d due, rep *ReconcileReport) error {
	lookup := c.cfg.Lookup != nil
	reason := ""
	switch {
	case d.ageSeconds >= c.cfg.MaxAge.Seconds():
		reason = fmt.Sprintf("outcome unknown for %s, past the bound (MaxAge %s)", time.Duration(d.ageSeconds*float64(time.Second)).Round(time.Second), c.cfg.MaxAge)
	case lookup && d.checks > c.cfg.MaxChecks:
		reason = fmt.Sprintf("outcome still unknown after %d checks (MaxChecks)", d.checks-1)
	case c.cfg.Mode == Neither && !c.cfg.BlindRetry && !d.retry:
		reason = "outcome unknown and the provider offers neither idempotency keys nor a lookup: calling again may duplicate the effect"
	}
	if reason != "" {
		parked, err := c.park(ctx, d.claim, Started, reason)
		if parked {
			rep.Parked++
		}
		return err
	}
	if !lookup {
		// Nothing to ask: unknown until its caller's next Do, or the bound.
		wait := max(c.cfg.MaxAge-time.Duration(d.ageSeconds*float64(time.Second)), time.Second)
		_, err := c.db.Exec(ctx, `UPDATE `+c.t+` SET state = 'unknown', lease_until = NULL,
	next_check_at = now() + make_interval(secs => $4), updated_at = now()
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = 'started'`, c.cfg.Name, d.key, d.token, secs(wait))
		if err != nil {
			return fmt.Errorf("record the attempt unknown: %w", err)
		}
		rep.Unresolved++
		return nil
	}
	if !c.callable(d.claim) {
		// The batch's claim is running out: a lookup now could end after
		// it, when another caller may own the attempt. Give it back.
		return c.deferCheck(ctx, d, rep)
	}
	lr, lerr, took := c.lookup(ctx, d.key)
	result := lookupResult(lr, lerr)
	c.observe(Observation{Op: OpLookup, LookupResult: result, Duration: took, Err: lerr})
	var o outcome
	switch result {
	case LookupError:
		rep.LookupErrors++
		o = outcome{state: Unknown, err: "lookup: " + lerr.Error()}
	case LookupNotFound:
		rep.NotFound++
		o = outcome{state: Unknown, err: "lookup: the provider has no record of the key (the next Do calls again)"}
	case LookupFailed:
		rep.Failed++
		o = outcome{state: Failed, response: lr.Response, err: "refused by the provider (found by lookup)", via: "lookup"}
	default:
		rep.Succeeded++
		o = outcome{state: Succeeded, response: lr.Response, via: "lookup"}
	}
	res, err := c.record(ctx, d.claim, o)
	if err == nil && res.State == Parked {
		rep.Parked++
	}
	if errors.Is(err, ErrLeaseLost) {
		return nil // someone else has it now
	}
	return err
}

// deferCheck gives back an attempt the reconciler claimed but did not look
// up: unknown, due at once, the check it counted uncounted.
func (c *Caller) deferCheck(ctx context.Context, d due, rep *ReconcileReport) error {
	rctx, cancel := c.recordCtx(ctx)
	defer cancel()
	_, err := c.db.Exec(rctx, `UPDATE `+c.t+` SET state = 'unknown', lease_until = NULL, next_check_at = now(),
	checks = greatest(checks - 1, 0), updated_at = now()
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = 'started'`, c.cfg.Name, d.key, d.token)
	if err != nil {
		return fmt.Errorf("give back the attempt: %w", err)
	}
	rep.Deferred++
	return nil
}

// park parks a claimed attempt in state from, fenced by the claim's token.
func (c *Caller) park(ctx context.Context, cl claim, from State, reason string) (bool, error) {
	rctx, cancel := c.recordCtx(ctx)
	defer cancel()
	n, err := c.db.Exec(rctx, `UPDATE `+c.t+` SET state = 'parked', parked_at = now(), park_reason = $5,
	unknown_since = coalesce(unknown_since, now()), lease_until = NULL, next_check_at = NULL,
	lease_token = lease_token + 1, updated_at = now()
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = $4`, c.cfg.Name, cl.key, cl.token, string(from), reason)
	if err != nil {
		return false, fmt.Errorf("park the attempt: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	c.observe(Observation{Op: OpPark, Reason: reason})
	return true, nil
}
