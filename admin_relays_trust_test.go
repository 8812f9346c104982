package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestRelayRowsAheadOrOversizedAreNotBelieved: a heartbeat row is written
// by the relay role. One whose heartbeat_at is more than RelayClockSkew
// ahead of the database's clock (a relay's heartbeat takes the database's
// now()) made Status, Gauges (outbox_relays_alive), `status --check` and
// the console count a relay alive for as long as the row said, and its
// failures counted in History; one whose health document was hundreds of
// kilobytes was fetched and parsed by every status and console page. Now
// the first is not alive and is flagged, the second's health is left
// unread and flagged, and neither adds to History's failures; a heartbeat
// within the skew, and a normal row, are believed.
func TestRelayRowsAheadOrOversizedAreNotBelieved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	a := newAdmin(t, pool, schema)
	// minutes: a health document whose current minute counts failed
	// attempts; big: over 150 kB of text that does not compress away.
	const minutes = `jsonb_build_array(jsonb_build_object('minute', to_char(date_trunc('minute', now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'published', 0, 'failed', %s))`
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_relays (relay_id, heartbeat_at, expires_at, health) VALUES
	('good', now(), now() + interval '30 seconds', jsonb_build_object('ready', true, 'minutes', `+strings.Replace(minutes, "%s", "7", 1)+`)),
	('skewed', now() + interval '30 seconds', now() + interval '60 seconds', '{"ready": true}'),
	('ahead', now() + interval '1 day', now() + interval '1 day 30 seconds', jsonb_build_object('ready', true, 'minutes', `+strings.Replace(minutes, "%s", "500", 1)+`)),
	('big', now(), now() + interval '30 seconds', jsonb_build_object('ready', true, 'minutes', `+strings.Replace(minutes, "%s", "40", 1)+`,
		'reason', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 5000) i)))`); err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]outbox.RelayInfo{}
	for _, r := range st.Relays {
		by[r.ID] = r
	}
	if st.RelaysAlive != 3 || !by["good"].Alive || !by["skewed"].Alive || !by["big"].Alive || by["ahead"].Alive {
		t.Fatalf("relays alive: %d (%+v); want good, skewed and big, not ahead", st.RelaysAlive, st.Relays)
	}
	if u := by["ahead"].Untrusted; !strings.Contains(u, "ahead of the database's clock") || !strings.Contains(u, "not counted alive") {
		t.Errorf("the row ahead of the clock is flagged %q", u)
	}
	if r := by["big"]; r.Health != nil || !strings.Contains(r.Untrusted, "health document of") || !strings.Contains(r.Untrusted, "over the 65536 read") {
		t.Errorf("the oversized health: read %v, flagged %q; want unread and flagged", r.Health != nil, r.Untrusted)
	}
	if r := by["good"]; r.Health == nil || !r.Health.Ready || r.Untrusted != "" {
		t.Errorf("the normal row: health %+v, flagged %q", r.Health, r.Untrusted)
	}
	if r := by["skewed"]; r.Untrusted != "" {
		t.Errorf("a heartbeat 30 s ahead (within the skew) is flagged %q", r.Untrusted)
	}
	g, err := a.Gauges(ctx)
	if err != nil || g.RelaysAlive != 3 {
		t.Fatalf("Gauges: %d relays alive, %v; want 3", g.RelaysAlive, err)
	}
	hist, err := a.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var failed int64
	for _, m := range hist {
		failed += m.Failed
	}
	if failed != 7 {
		t.Fatalf("History counts %d failed attempts; want the normal row's 7 (not the row ahead's 500 nor the oversized one's 40)", failed)
	}
}
