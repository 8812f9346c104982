package sideeffect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgretry"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Failpoints of Do (OUTBOX_FAILPOINTS, for chaos tests): after the claim
// committed and before the call, and after the call returned and before its
// outcome is recorded. A crash at either leaves the attempt started; an
// injected error returns without recording, which is the same to the next
// caller once the lease ends.
const (
	FailpointBeforeCall            = "sideeffect/before-call"
	FailpointAfterCallBeforeRecord = "sideeffect/after-call-before-record"
)

// Do makes the call for key at most once as far as the provider's mode
// allows, recording the attempt in the side_effects table before calling
// and its outcome after:
//
//   - a key seen for the first time is claimed (state started, the request's
//     fingerprint recorded) and called;
//   - a key already Succeeded or Failed returns the recorded outcome
//     (Result.Replayed) and calls nothing; a Failed outcome is a Result,
//     not an error: check Result.State;
//   - a key Unknown (or started by a caller whose lease expired: it may
//     have called) is looked up first when a Lookup is configured (found:
//     recorded; not found: called again), called again with the same key
//     in mode Idempotent, and in mode Neither parked, or called again as a
//     counted blind retry with Config.BlindRetry. Past the bound
//     (Config.MaxChecks, Config.MaxAge) it is parked instead;
//   - a key held by another caller returns ErrInProgress, a parked one
//     ErrParked, and one first used with another request
//     ErrFingerprintMismatch.
//
// request is the request's canonical bytes (the same request must give the
// same bytes on every retry); only its sha256 is stored. An ambiguous call
// returns ErrUnknown: call Do again later, e.g. on the event's redelivery.
// Do does not recover a panic of call: the attempt then stays started and,
// after its lease, is treated as unknown, like after a crash.
func (c *Caller) Do(ctx context.Context, key string, request []byte, call Call) (Result, error) {
	if err := checkName("key", key); err != nil {
		return Result{}, err
	}
	if call == nil {
		return Result{}, errors.New("sideeffect: Do needs a call")
	}
	fp := Fingerprint(request)
	cl, res, err := c.claim(ctx, key, fp[:])
	if err != nil || res != nil {
		if res == nil {
			res = &Result{Key: key}
		}
		return *res, c.wrap(key, err)
	}
	out, err := c.run(ctx, cl, call)
	return out, c.wrap(key, err)
}

func (c *Caller) wrap(key string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sideeffect %s, key %s: %w", c.cfg.Name, key, err)
}

// claim is a Do's hold on an attempt.
type claim struct {
	key      string
	token    int64
	fresh    bool // this Do inserted the row
	lookup   bool // look the key up before calling
	blind    bool // the call is a blind retry
	attempts int
	checks   int
	// leaseEnd is when the lease the last claiming statement granted ends,
	// by the caller's clock (Config.Clock), conservatively: the statement's
	// now() is no earlier than the moment it was sent, so the lease ends no
	// earlier than leaseEnd.
	leaseEnd time.Time
}

// realTime is t of the caller's clock on time.Now's.
func (c *Caller) realTime(t time.Time) time.Time { return time.Now().Add(t.Sub(c.cfg.Clock())) }

// granted is the local end of a lease granted by a statement sent at sent.
func (c *Caller) granted(sent time.Time) time.Time { return sent.Add(c.cfg.Lease) }

// leaseMargin is what a call must leave of its claim's lease when its
// CallTimeout ends: half of the room the lease has beyond a call, the other
// half being what the call may start late after the claim (the time between
// the claim and the call, normally milliseconds). Past it, the outcome's
// record still has leaseMargin to commit under the claim, and the provider
// that much to finish a request the caller gave up on before another caller
// may look the key up.
func (c *Caller) leaseMargin() time.Duration { return (c.cfg.Lease - c.cfg.CallTimeout) / 2 }

// callable says whether a call starting now, and running for up to
// CallTimeout, ends at least leaseMargin before the claim's lease does.
func (c *Caller) callable(cl claim) bool {
	return !c.cfg.Clock().Add(c.cfg.CallTimeout).After(cl.leaseEnd.Add(-c.leaseMargin()))
}

// current is an existing attempt, read under its row lock.
type current struct {
	state       State
	fingerprint []byte
	response    []byte
	lastError   string
	attempts    int
	checks      int
	live        bool    // the lease has not expired
	ageSeconds  float64 // since the outcome became unknown (or the lease expired)
	via         string
	parkReason  string
	retry       bool // an operator allowed one more call
}

func (cur current) result(key string) Result {
	return Result{Key: key, State: cur.state, Response: cur.response, Error: cur.lastError, Attempts: cur.attempts, Via: cur.via}
}

// secs renders a duration for make_interval.
func secs(d time.Duration) float64 { return d.Seconds() }

// claim takes the attempt for a call (or a lookup), or returns the Result
// that makes a call needless or impossible.
func (c *Caller) claim(ctx context.Context, key string, fp []byte) (claim, *Result, error) {
	for range 3 {
		var token int64
		sent := c.cfg.Clock()
		err := c.db.QueryRow(ctx, `INSERT INTO `+c.t+` AS s
	(name, key, mode, state, fingerprint, attempts, lease_until, next_check_at, last_attempt_at)
VALUES ($1, $2, $3, 'started', $4, 1, now() + make_interval(secs => $5), now() + make_interval(secs => $5), now())
ON CONFLICT (name, key) DO NOTHING
RETURNING lease_token`, c.cfg.Name, key, c.cfg.Mode.String(), fp, secs(c.cfg.Lease)).Scan(&token)
		if err == nil {
			return claim{key: key, token: token, fresh: true, attempts: 1, leaseEnd: c.granted(sent)}, nil, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return claim{}, nil, fmt.Errorf("record the attempt: %w", err)
		}
		// A final outcome never changes: answer it without a transaction
		// (the common case of a redelivery).
		if cur, err := c.readCurrent(ctx, c.db, key, ""); err == nil && (cur.state == Succeeded || cur.state == Failed) {
			res := cur.result(key)
			if !bytes.Equal(cur.fingerprint, fp) {
				return claim{}, &res, ErrFingerprintMismatch
			}
			res.Replayed = true
			c.observe(Observation{Op: OpReplay, State: cur.state})
			return claim{}, &res, nil
		}
		var cl claim
		var res *Result
		var gone bool
		var after error      // decided and written: returned once committed
		sent = c.cfg.Clock() // the claim's now() is the transaction's start, later
		err = c.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
			cur, err := c.lockCurrent(ctx, tx, key)
			if errors.Is(err, pgx.ErrNoRows) {
				gone = true // deleted after a NotSent call: insert again
				return nil
			}
			if err != nil {
				return fmt.Errorf("read the attempt: %w", err)
			}
			cl, res, err = c.decide(ctx, tx, key, fp, cur)
			var ct commitThen
			if errors.As(err, &ct) {
				after = ct.err
				return nil
			}
			return err
		})
		switch {
		case err != nil:
			return claim{}, res, err
		case after != nil:
			return claim{}, res, after
		case !gone:
			cl.leaseEnd = c.granted(sent)
			return cl, res, nil
		}
	}
	return claim{}, nil, errors.New("the attempt kept disappearing while being claimed")
}

func (c *Caller) lockCurrent(ctx context.Context, tx pgtx.Querier, key string) (current, error) {
	return c.readCurrent(ctx, tx, key, " FOR UPDATE")
}

func (c *Caller) readCurrent(ctx context.Context, db pgtx.Querier, key, lock string) (current, error) {
	var cur current
	err := db.QueryRow(ctx, `SELECT state, fingerprint, response, coalesce(last_error, ''), attempts, checks,
	coalesce(lease_until > now(), false),
	extract(epoch FROM now() - coalesce(unknown_since, lease_until, now()))::float8,
	coalesce(resolved_via, ''), coalesce(park_reason, ''), operator_retry
FROM `+c.t+` WHERE name = $1 AND key = $2`+lock, c.cfg.Name, key).Scan(
		&cur.state, &cur.fingerprint, &cur.response, &cur.lastError, &cur.attempts, &cur.checks,
		&cur.live, &cur.ageSeconds, &cur.via, &cur.parkReason, &cur.retry)
	return cur, err
}

// decide reads an existing attempt: it returns the Result that makes a call
// needless or impossible (replay, in progress, parked, refused), or claims
// the attempt for a lookup or a call.
func (c *Caller) decide(ctx context.Context, tx pgtx.Querier, key string, fp []byte, cur current) (claim, *Result, error) {
	res := cur.result(key)
	if !bytes.Equal(cur.fingerprint, fp) {
		return claim{}, &res, ErrFingerprintMismatch
	}
	switch {
	case cur.state == Succeeded || cur.state == Failed:
		res.Replayed = true
		c.observe(Observation{Op: OpReplay, State: cur.state})
		return claim{}, &res, nil
	case cur.state == Parked:
		return claim{}, &res, fmt.Errorf("%w: %s", ErrParked, cur.parkReason)
	case cur.state == Started && cur.live:
		return claim{}, &res, ErrInProgress
	}
	// Unknown, or started by a caller whose lease expired: the call may
	// have happened.
	lookup := c.cfg.Lookup != nil
	reason := ""
	switch {
	case cur.retry:
		// An operator allowed a call (Admin.Resolve, retry): the bound
		// and mode Neither's park do not apply to it.
	case cur.ageSeconds >= c.cfg.MaxAge.Seconds():
		reason = fmt.Sprintf("outcome unknown for %s, past the bound (MaxAge %s)", time.Duration(cur.ageSeconds*float64(time.Second)).Round(time.Second), c.cfg.MaxAge)
	case lookup && cur.checks >= c.cfg.MaxChecks:
		reason = fmt.Sprintf("outcome still unknown after %d checks (MaxChecks)", cur.checks)
	case c.cfg.Mode == Neither && !c.cfg.BlindRetry:
		reason = "outcome unknown and the provider offers neither idempotency keys nor a lookup: calling again may duplicate the effect"
	}
	if reason != "" {
		if _, err := tx.Exec(ctx, `UPDATE `+c.t+` SET state = 'parked', parked_at = now(), park_reason = $3,
	unknown_since = coalesce(unknown_since, lease_until, now()), lease_until = NULL, next_check_at = NULL,
	lease_token = lease_token + 1, updated_at = now()
WHERE name = $1 AND key = $2`, c.cfg.Name, key, reason); err != nil {
			return claim{}, nil, fmt.Errorf("park the attempt: %w", err)
		}
		c.observe(Observation{Op: OpPark, Reason: reason})
		res.State = Parked
		// The park must commit: return its error through the Result path.
		return claim{}, &res, errCommitThen(fmt.Errorf("%w: %s", ErrParked, reason))
	}
	cl := claim{key: key, lookup: lookup, blind: c.cfg.Mode == Neither}
	addCheck, addAttempt, addBlind := 0, 1, 0
	if lookup {
		addCheck, addAttempt = 1, 0
	}
	if cl.blind {
		addBlind = 1
	}
	err := tx.QueryRow(ctx, `UPDATE `+c.t+` SET state = 'started', lease_token = lease_token + 1,
	lease_until = now() + make_interval(secs => $3), next_check_at = now() + make_interval(secs => $3),
	unknown_since = coalesce(unknown_since, lease_until, now()),
	checks = checks + $4, attempts = attempts + $5, blind_retries = blind_retries + $6, operator_retry = false,
	last_attempt_at = CASE WHEN $5 > 0 THEN now() ELSE last_attempt_at END, updated_at = now()
WHERE name = $1 AND key = $2
RETURNING lease_token, attempts, checks`, c.cfg.Name, key, secs(c.cfg.Lease), addCheck, addAttempt, addBlind).Scan(&cl.token, &cl.attempts, &cl.checks)
	if err != nil {
		return claim{}, nil, fmt.Errorf("claim the attempt: %w", err)
	}
	return cl, nil, nil
}

// commitThen is an error that lets the transaction commit and is returned
// to Do's caller afterwards.
type commitThen struct{ err error }

func (e commitThen) Error() string { return e.err.Error() }
func (e commitThen) Unwrap() error { return e.err }

func errCommitThen(err error) error { return commitThen{err} }

// run looks the key up when the claim says so, calls, and records.
func (c *Caller) run(ctx context.Context, cl claim, call Call) (Result, error) {
	if cl.lookup {
		res, done, err := c.lookupBeforeCall(ctx, &cl)
		if done || err != nil {
			return res, err
		}
	}
	if err := failpoint.Hit(FailpointBeforeCall); err != nil {
		return Result{Key: cl.key, State: Started}, err
	}
	// The call's context is made before the lease is checked, so that its
	// deadline is no later than the check allowed for.
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	if !c.callable(cl) {
		// Paused since the claim (a GC pause, SIGSTOP, a frozen VM, a slow
		// lookup): the lease has ended, or ends before the call could. Past
		// it another caller may have taken the attempt over and be calling;
		// calling now could be the second effect. Call nothing and give the
		// claim back, fenced: if no one took it over, the attempt is as
		// before this Do.
		cancel()
		return c.refuseLate(ctx, cl)
	}
	start := time.Now()
	resp, callErr := call(cctx, cl.key)
	took := time.Since(start)
	cancel()
	if err := failpoint.Hit(FailpointAfterCallBeforeRecord); err != nil {
		// As if the process died here: nothing recorded, the attempt stays
		// started until its lease ends.
		return Result{Key: cl.key, State: Started, Called: true}, err
	}
	rec := outcome{via: "call"}
	switch {
	case callErr == nil:
		rec.state, rec.response = Succeeded, resp
	case classify(callErr) == kindRejected:
		rec.state, rec.response, rec.err = Failed, resp, callErr.Error()
	case classify(callErr) == kindNotSent:
		c.observe(Observation{Op: OpCall, Blind: false, Duration: took, Err: callErr})
		if err := c.recordNotSent(ctx, cl, callErr); err != nil {
			return Result{Key: cl.key, State: Started}, err
		}
		return Result{Key: cl.key, State: Unknown, Attempts: cl.attempts - 1}, fmt.Errorf("not sent, call again: %w", callErr)
	default:
		rec.state, rec.err = Unknown, callErr.Error()
	}
	res, err := c.record(ctx, cl, rec)
	res.Called = true
	c.observe(Observation{Op: OpCall, State: rec.state, Blind: cl.blind, Duration: took, Err: callErr})
	if err != nil {
		return res, err
	}
	switch res.State {
	case Unknown:
		return res, fmt.Errorf("%w: %v", ErrUnknown, callErr)
	case Parked:
		return res, fmt.Errorf("%w: %s (the last call: %v)", ErrParked, res.Error, callErr)
	}
	return res, nil
}

// refuseLate ends a Do whose claim ran out before its call: nothing was
// called; the claim is released like after a call not sent.
func (c *Caller) refuseLate(ctx context.Context, cl claim) (Result, error) {
	late := fmt.Errorf("%w: paused for %s between the claim and the call, too late to call (the lease is %s, the call may take %s)",
		ErrLeaseExpired, c.cfg.Clock().Sub(cl.leaseEnd.Add(-c.cfg.Lease)).Round(time.Millisecond), c.cfg.Lease, c.cfg.CallTimeout)
	if err := c.recordNotSent(ctx, cl, late); err != nil {
		return Result{Key: cl.key, State: Started}, errors.Join(late, err)
	}
	return Result{Key: cl.key, State: Unknown, Attempts: cl.attempts - 1}, late
}

// lookupBeforeCall asks the provider about a claimed unknown attempt. done
// is true when the answer settled the attempt (or the lookup failed);
// otherwise the provider has no record and the caller may call, the
// attempt counted.
func (c *Caller) lookupBeforeCall(ctx context.Context, cl *claim) (Result, bool, error) {
	lr, lerr, took := c.lookup(ctx, cl.key)
	c.observe(Observation{Op: OpLookup, LookupResult: lookupResult(lr, lerr), Duration: took, Err: lerr})
	switch {
	case lerr != nil:
		res, err := c.record(ctx, *cl, outcome{state: Unknown, err: "lookup: " + lerr.Error()})
		if err != nil {
			return res, true, err
		}
		if res.State == Parked {
			return res, true, fmt.Errorf("%w: %s", ErrParked, res.Error)
		}
		return res, true, fmt.Errorf("%w: lookup: %v", ErrUnknown, lerr)
	case lr.Found:
		rec := outcome{state: Succeeded, response: lr.Response, via: "lookup"}
		if lr.Failed {
			rec.state, rec.err = Failed, "refused by the provider (found by lookup)"
		}
		res, err := c.record(ctx, *cl, rec)
		return res, true, err
	}
	// Not found: the call never reached the provider. Count the call
	// about to be made, and renew the claim for it.
	rctx, cancel := c.recordCtx(ctx)
	defer cancel()
	sent := c.cfg.Clock()
	err := c.db.QueryRow(rctx, `UPDATE `+c.t+` SET attempts = attempts + 1, last_attempt_at = now(),
	lease_until = now() + make_interval(secs => $4), next_check_at = now() + make_interval(secs => $4), updated_at = now()
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = 'started'
RETURNING attempts`, c.cfg.Name, cl.key, cl.token, secs(c.cfg.Lease)).Scan(&cl.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return Result{Key: cl.key, State: Started}, true, ErrLeaseLost
	}
	if err != nil {
		return Result{Key: cl.key, State: Started}, true, fmt.Errorf("record the attempt: %w", err)
	}
	cl.leaseEnd = c.granted(sent) // the call is bounded by the renewed lease
	return Result{}, false, nil
}

func (c *Caller) lookup(ctx context.Context, key string) (LookupResult, error, time.Duration) {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	start := time.Now()
	lr, err := c.cfg.Lookup.Lookup(lctx, key)
	return lr, err, time.Since(start)
}

func lookupResult(lr LookupResult, err error) string {
	switch {
	case err != nil:
		return LookupError
	case !lr.Found:
		return LookupNotFound
	case lr.Failed:
		return LookupFailed
	}
	return LookupSucceeded
}

// outcome is what record writes.
type outcome struct {
	state    State // Succeeded, Failed or Unknown
	response []byte
	err      string
	via      string // for a final state
}

// recordCtx outlives the caller's ctx: an outcome learnt must be written
// even when the caller gave up meanwhile.
func (c *Caller) recordCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CallTimeout)
}

// record writes an outcome under the claim's fence. An Unknown outcome past
// the bound parks the attempt.
func (c *Caller) record(ctx context.Context, cl claim, o outcome) (Result, error) {
	rctx, cancel := c.recordCtx(ctx)
	defer cancel()
	// The error's text comes from the call (a provider's body echoed, a
	// driver): stored as PostgreSQL's text takes it, or the outcome could
	// not be recorded at all.
	o.err = pgtext.Clean(o.err, 0)
	res := Result{Key: cl.key, State: o.state, Response: o.response, Error: o.err}
	var via, lastErr *string
	if o.state != Unknown {
		via = &o.via
	}
	if o.err != "" {
		lastErr = &o.err
	}
	var next *float64
	if o.state == Unknown {
		n := secs(c.backoff(cl.checks))
		next = &n
	}
	var checks int
	var age float64
	// The outcome was learnt from the provider: a connection lost while it is
	// written must not throw it away (the attempt would stay started, and
	// its next Do would ask the provider again, or call again in mode
	// neither). The write is fenced by the lease token, which every claim
	// increments, so it is tried again on another connection until the
	// lease ends; a retry that finds the row no longer started but still
	// under this token, in the state written, finds the first attempt's
	// write, which committed unseen.
	err := pgretry.Do(rctx, c.realTime(cl.leaseEnd), func(ctx context.Context, a pgretry.Attempt) error {
		err := c.db.QueryRow(ctx, `UPDATE `+c.t+` SET state = $4, response = coalesce($5, response), last_error = $6, resolved_via = $7,
	lease_until = NULL, next_check_at = now() + make_interval(secs => $8),
	unknown_since = CASE WHEN $4 = 'unknown' THEN coalesce(unknown_since, now()) ELSE unknown_since END, updated_at = now()
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = 'started'
RETURNING attempts, checks, coalesce(extract(epoch FROM now() - unknown_since), 0)::float8`,
			c.cfg.Name, cl.key, cl.token, string(o.state), o.response, lastErr, via, next).Scan(&res.Attempts, &checks, &age)
		if errors.Is(err, pgx.ErrNoRows) && a.Retried() {
			err = c.db.QueryRow(ctx, `SELECT attempts, checks, coalesce(extract(epoch FROM now() - unknown_since), 0)::float8 FROM `+c.t+`
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = $4`,
				c.cfg.Name, cl.key, cl.token, string(o.state)).Scan(&res.Attempts, &checks, &age)
		}
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		res.State = Started
		return res, ErrLeaseLost
	}
	if err != nil {
		return res, fmt.Errorf("record the outcome (%s): %w", o.state, err)
	}
	if o.state != Unknown {
		res.Via = o.via
		return res, nil
	}
	reason := ""
	switch {
	case age >= c.cfg.MaxAge.Seconds():
		reason = fmt.Sprintf("outcome unknown for %s, past the bound (MaxAge %s)", time.Duration(age*float64(time.Second)).Round(time.Second), c.cfg.MaxAge)
	case c.cfg.Lookup != nil && checks >= c.cfg.MaxChecks:
		reason = fmt.Sprintf("outcome still unknown after %d checks (MaxChecks)", checks)
	}
	if reason == "" {
		return res, nil
	}
	parked, err := c.park(ctx, cl, Unknown, reason)
	if err != nil {
		return res, err
	}
	if parked {
		res.State, res.Error = Parked, reason
	}
	return res, nil
}

// recordNotSent undoes the claim of a call that never reached the provider:
// a row this Do created is deleted (nothing happened), an older one goes
// back to unknown without counting the call.
func (c *Caller) recordNotSent(ctx context.Context, cl claim, callErr error) error {
	rctx, cancel := c.recordCtx(ctx)
	defer cancel()
	var err error
	if cl.fresh {
		_, err = c.db.Exec(rctx, `DELETE FROM `+c.t+` WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = 'started'`,
			c.cfg.Name, cl.key, cl.token)
	} else {
		blind := 0
		if cl.blind {
			blind = 1
		}
		_, err = c.db.Exec(rctx, `UPDATE `+c.t+` SET state = 'unknown', attempts = attempts - 1, blind_retries = blind_retries - $4,
	last_error = $5, lease_until = NULL, next_check_at = now() + make_interval(secs => $6), updated_at = now()
WHERE name = $1 AND key = $2 AND lease_token = $3 AND state = 'started'`,
			c.cfg.Name, cl.key, cl.token, blind, pgtext.Clean("not sent: "+callErr.Error(), 0), secs(c.backoff(cl.checks)))
	}
	if err != nil {
		return fmt.Errorf("release the attempt after a call not sent: %w", err)
	}
	return nil
}
