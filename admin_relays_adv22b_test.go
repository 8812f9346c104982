package outbox_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdv22bRelayRowAtInfinityDoesNotBreakStatus: the relay role can store
// 'infinity' in heartbeat_at or expires_at (timestamptz takes it). Status
// must still answer (the console's pages, status --check, which would
// otherwise fail on a row the relay role wrote, not on the outbox's state)
// and not count a row expiring at infinity alive. (The expires_at scan
// failed before 4d0d0b2 too; "cannot subtract infinite timestamps" on
// heartbeat_at comes from 4d0d0b2's extract(epoch FROM heartbeat_at - now()).)
func TestAdv22bRelayRowAtInfinityDoesNotBreakStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	a := newAdmin(t, pool, schema)
	for _, tc := range []struct {
		row       string
		deadAlive bool // the row must not be counted alive
	}{
		{`('inf-expiry', now(), 'infinity')`, true},
		{`('inf-beat', 'infinity', 'infinity')`, true},
		{`('neg-beat', '-infinity', now() + interval '30 seconds')`, false},
	} {
		row := tc.row
		if _, err := pool.Exec(ctx, `DELETE FROM `+schema+`.outbox_relays`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_relays (relay_id, heartbeat_at, expires_at) VALUES `+row); err != nil {
			t.Fatal(err)
		}
		st, err := a.Status(ctx)
		if err != nil {
			t.Errorf("Status with relay row %s: %v", row, err)
			continue
		}
		if tc.deadAlive && st.RelaysAlive != 0 {
			t.Errorf("relay row %s counted alive (untrusted %q)", row, st.Relays[0].Untrusted)
		}
		if _, err := a.History(ctx); err != nil {
			t.Errorf("History with relay row %s: %v", row, err)
		}
	}
}
