package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
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

// TestRelayRowExpiringACenturyAheadIsNotAliveForever: the relay role can
// write a heartbeat row whose expires_at is a century after its
// heartbeat_at. No relay's heartbeat lives longer than
// RelayHeartbeatLifetimeMax (RelayConfig caps HeartbeatInterval and
// IdleBackoffMax at a third of it), so once heartbeat_at is older than that
// the row is dead in Status, in Gauges (outbox_relays_alive) and for
// `status --check`, and Status says why it is not believed.
func TestRelayRowExpiringACenturyAheadIsNotAliveForever(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	a := newAdmin(t, pool, schema)
	for _, tc := range []struct {
		beat  string
		alive bool
	}{
		{"now() - interval '2 hours'", false},
		{"now() - interval '61 minutes'", false},
		{"now() - interval '1 minute'", true}, // believed for the hour after its heartbeat, as a relay's would be
	} {
		if _, err := pool.Exec(ctx, `DELETE FROM `+schema+`.outbox_relays`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_relays (relay_id, heartbeat_at, expires_at)
			VALUES ('century', `+tc.beat+`, now() + interval '100 years')`); err != nil {
			t.Fatal(err)
		}
		st, err := a.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g, err := a.Gauges(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if tc.alive {
			want = 1
		}
		if st.RelaysAlive != want || g.RelaysAlive != want || len(st.Relays) != 1 || st.Relays[0].Alive != tc.alive {
			t.Errorf("heartbeat_at %s, expires_at a century ahead: Status alive %d, Gauges alive %d, want %d", tc.beat, st.RelaysAlive, g.RelaysAlive, want)
		}
		if len(st.Relays) == 1 && !strings.Contains(st.Relays[0].Untrusted, "expires_at is more than 1h0m0s after heartbeat_at") {
			t.Errorf("heartbeat_at %s: untrusted %q, want it to say the expiry is not believed", tc.beat, st.Relays[0].Untrusted)
		}
	}
}

// TestRelayConfigCapsTheHeartbeatsLifetime: a HeartbeatInterval or an
// IdleBackoffMax over a third of RelayHeartbeatLifetimeMax is refused, so
// that no relay writes a heartbeat row that status would not believe.
func TestRelayConfigCapsTheHeartbeatsLifetime(t *testing.T) {
	pool, schema := outboxtest.Schema(t)
	for _, mut := range []func(*outbox.RelayConfig){
		func(c *outbox.RelayConfig) { c.HeartbeatInterval = outbox.RelayHeartbeatLifetimeMax/3 + time.Second },
		func(c *outbox.RelayConfig) { c.IdleBackoffMax = outbox.RelayHeartbeatLifetimeMax/3 + time.Second },
	} {
		cfg := quietConfig(schema, outbox.PublisherFunc(func(context.Context, []outbox.Message) []error { return nil }))
		mut(&cfg)
		if _, err := outbox.NewRelay(pool, cfg); err == nil || !strings.Contains(err.Error(), "is over 20m0s") {
			t.Errorf("NewRelay: %v, want a refusal over 20m0s", err)
		}
	}
}
