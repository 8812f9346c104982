// Package pgretry retries a database write that must not be lost to a
// dropped connection: a write that follows an external call (a relay's mark
// after the broker's ack, a side effect's record after the provider's
// answer). When the connection dies (a failover, a pooler restart,
// idle_session_timeout, pg_terminate_backend), the write is tried again on
// another connection of the pool, within a deadline: the lease under which
// the write is fenced.
//
// Only writes that are safe to repeat may be retried: fenced by a token (the
// first attempt, if it committed, took the row out of the fence, so the
// second changes nothing) or idempotent. A retried write whose first attempt
// committed unseen finds nothing to change; the caller tells that apart from
// a lost lease itself (see Attempt).
package pgretry

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectionLost reports whether err means the connection to the server was
// lost or refused, rather than the statement failing: the statement may or
// may not have been executed (and committed), and another connection may
// succeed.
func ConnectionLost(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", // admin_shutdown: pg_terminate_backend, a fast shutdown
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now: starting up, in recovery
			"57P05", // idle_session_timeout
			"25P03": // idle_in_transaction_session_timeout
			return true
		}
		return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08" // connection_exception
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded)
}

// Attempt is passed to a retried write: N counts from 1; a write with N > 1
// follows a lost connection, so its first attempt may have committed unseen.
type Attempt struct{ N int }

// Retried reports whether this is not the first attempt.
func (a Attempt) Retried() bool { return a.N > 1 }

// Do runs write until it succeeds, fails otherwise than by a lost
// connection, ctx ends, or until passes (then the last error is returned).
// Between attempts it waits 10 ms, doubling up to 200 ms, never past until.
func Do(ctx context.Context, until time.Time, write func(ctx context.Context, a Attempt) error) error {
	wait := 10 * time.Millisecond
	for n := 1; ; n++ {
		err := write(ctx, Attempt{N: n})
		if err == nil || !ConnectionLost(err) || ctx.Err() != nil {
			return err
		}
		left := time.Until(until)
		if left <= 0 {
			return err
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}
