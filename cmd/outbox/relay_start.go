package main

// Start-up: `outbox relay` may start before its database or its broker (a
// normal deploy order). It serves /healthz and /readyz at once, reports
// what it waits for on /readyz, retries with backoff, and starts relaying
// when both answer. SIGINT/SIGTERM while waiting end it cleanly.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/outbox/internal/backoff"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
)

// Bounds of the pause between two start-up attempts.
const (
	startRetryMin = 250 * time.Millisecond
	startRetryMax = 5 * time.Second
)

// relayReadiness backs /readyz: what the relay waits for while it starts,
// then the relay's own Ready.
type relayReadiness struct {
	waiting atomic.Pointer[error]
	relay   atomic.Pointer[outbox.Relay]
}

func newRelayReadiness() *relayReadiness {
	r := &relayReadiness{}
	r.wait(errors.New("starting"))
	return r
}

func (r *relayReadiness) wait(err error) { r.waiting.Store(&err) }

func (r *relayReadiness) started(relay *outbox.Relay) { r.relay.Store(relay) }

func (r *relayReadiness) ready() error {
	if relay := r.relay.Load(); relay != nil {
		return relay.Ready()
	}
	return *r.waiting.Load()
}

// startWaiter retries one start-up step (reach the database, reach the
// destination) while its error says the other side is not there yet.
type startWaiter struct {
	what     string // "database", "destination"
	log      *slog.Logger
	ready    *relayReadiness
	attempts int
}

// retry records err as the reason the relay is not ready, logs it and
// pauses with backoff. It returns ctx's error when ctx ended.
func (w *startWaiter) retry(ctx context.Context, err error) error {
	w.attempts++
	w.ready.wait(fmt.Errorf("waiting for the %s: %w", w.what, err))
	d := startBackoff(w.attempts)
	w.log.Warn("waiting for the "+w.what, slog.Any("error", err), slog.Int("attempt", w.attempts), slog.Duration("retry_in", d))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// until runs step until it succeeds, fails with an error that waiting
// cannot fix (returned), or ctx ends (ctx's error).
func (w *startWaiter) until(ctx context.Context, step func(context.Context) error, transient func(error) bool) error {
	for {
		err := step(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !transient(err):
			return err
		}
		if err := w.retry(ctx, err); err != nil {
			return err
		}
	}
}

// startBackoff doubles from startRetryMin to startRetryMax, with jitter.
func startBackoff(n int) time.Duration { return backoff.Jittered(n, startRetryMin, startRetryMax) }

// databaseUnreachable reports whether err means the database is not there
// (yet): no connection, a connection lost, or a server starting, shutting
// down or out of connections. An error the server answered otherwise (bad
// password, no such database, a failed statement) is not waited out.
func databaseUnreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources (too many connections)
			"57": // operator intervention (starting up, shutting down)
			return true
		}
		return false
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
