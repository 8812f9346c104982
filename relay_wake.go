package outbox

// Wake-ups: LISTEN on the schema's channel (and Wake, for writers in the
// same process) cut an idle relay's poll short.
// The argument: docs/design.md, "Wake-ups".

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wake makes an idle relay look for events now. It never blocks; wake-ups
// that arrive while the relay is busy collapse into one.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) waitIdle(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-r.wake:
	}
}

// listen holds one connection with LISTEN on the schema's channel and turns
// notifications into wake-ups. On any error it reconnects after a pause; the
// relay keeps polling meanwhile.
func (r *Relay) listen(ctx context.Context) {
	channel := pgx.Identifier{NotifyChannel(r.schema.Name())}.Sanitize()
	failures := 0
	for ctx.Err() == nil {
		err := func() error {
			conn, err := r.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
				return err
			}
			defer func() {
				// The connection goes back to the pool: stop listening first.
				// If ctx was canceled mid-wait the connection is closed by pgx.
				if !conn.Conn().IsClosed() {
					_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+channel)
				}
			}()
			failures = 0
			r.Wake() // catch anything committed before LISTEN took effect
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
					return err
				}
				r.Wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		failures++
		r.log.Warn("listen for notifications failed; polling meanwhile", slog.Any("error", err))
		sleep(ctx, backoff(failures, 100*time.Millisecond, 5*time.Second))
	}
}
