package outboxfleet

// One LISTEN connection per database for every source's channel. The
// listener is a connection of its own (not one of the pool's), LISTENing on
// outbox.NotifyChannel of each running source and on a control channel of
// its own: when sources start or are retired, the fleet sends one NOTIFY on
// the control channel, and the listener, woken by it, LISTENs or UNLISTENs
// the difference. A notification on a source's channel wakes that source's
// relay.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
)

// listenLoop holds the database's LISTEN connection until ctx ends,
// reconnecting after a failure with backoff; the look finds events
// meanwhile.
func (d *database) listenLoop(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := d.listenOnce(ctx, &failures)
		if ctx.Err() != nil {
			return
		}
		failures++
		if failures == 1 {
			d.log().Warn("listen for notifications failed; the sources are looked at every poll interval meanwhile", slog.Any("error", err))
		}
		t := time.NewTimer(backoff.Jittered(failures, 100*time.Millisecond, 5*time.Second))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (d *database) listenOnce(ctx context.Context, failures *int) error {
	conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var b [8]byte
	_, _ = rand.Read(b[:])
	control := "outbox_fleet_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{control}.Sanitize()); err != nil {
		return err
	}
	listening := map[string]*source{}
	sync := func() error {
		want := map[string]*source{}
		for _, s := range d.running() {
			want[outbox.NotifyChannel(s.schema)] = s
		}
		var stmts []string
		var added []*source
		for ch, s := range want {
			if listening[ch] != s {
				stmts = append(stmts, "LISTEN "+pgx.Identifier{ch}.Sanitize())
				added = append(added, s)
			}
		}
		for ch := range listening {
			if _, ok := want[ch]; !ok {
				stmts = append(stmts, "UNLISTEN "+pgx.Identifier{ch}.Sanitize())
			}
		}
		if len(stmts) > 0 {
			// One round trip (simple protocol: several statements).
			if _, err := conn.Exec(ctx, strings.Join(stmts, "; ")); err != nil {
				return err
			}
		}
		listening = want
		// Whatever was committed before LISTEN took effect.
		for _, s := range added {
			s.relay.Wake()
		}
		return nil
	}
	if err := sync(); err != nil {
		return err
	}
	d.mu.Lock()
	d.control = control
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.control = ""
		d.mu.Unlock()
	}()
	// Sources may have changed between the sync and the control channel's
	// publication: look once more.
	if err := sync(); err != nil {
		return err
	}
	*failures = 0
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == control {
			if err := sync(); err != nil {
				return err
			}
			continue
		}
		if s := listening[n.Channel]; s != nil {
			s.relay.Wake()
		}
	}
}

// listenChanged tells the listener that sources started or were retired.
// Without a listener (not connected yet, reconnecting), nothing is sent: it
// syncs when it connects.
func (d *database) listenChanged(ctx context.Context) {
	d.mu.Lock()
	control := d.control
	d.mu.Unlock()
	if control == "" {
		return
	}
	if _, err := d.pool.Exec(ctx, "SELECT pg_notify($1, '')", control); err != nil && ctx.Err() == nil {
		d.log().Warn("tell the listener about new sources (they are looked at every poll interval meanwhile)", slog.Any("error", err))
	}
}
