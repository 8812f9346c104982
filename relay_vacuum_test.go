package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestRelayVacuumsWhereAutovacuumIsOff: with autovacuum off for
// outbox_events (here by the table's setting, so the test does not depend on
// the server's), a relay vacuums outbox_events and outbox_aggregates itself,
// and two relays of the schema never vacuum at once.
func TestRelayVacuumsWhereAutovacuumIsOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, table := range []string{"outbox_events", "outbox_aggregates"} {
		if _, err := pool.Exec(ctx, "ALTER TABLE "+schema+"."+table+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 20, 5)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	for range 2 {
		cfg := quietConfig(schema, b.pub)
		cfg.VacuumInterval = 20 * time.Millisecond
		startRelay(t, pool, cfg)
	}
	outboxtest.Eventually(t, 30*time.Second, "both tables vacuumed twice", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname IN ('outbox_events', 'outbox_aggregates') AND vacuum_count >= 2`, schema).Scan(&n)
		return err == nil && n == 2
	})
	outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return unpublished(t, pool, schema) == 0 })
}

// TestRelayThatCannotVacuumSaysSo: with autovacuum off and a relay whose
// role has the relay's grants but does not own the tables, VACUUM would
// skip them with a warning only the server log sees; the relay says once
// that it cannot vacuum and does not claim it did.
func TestRelayThatCannotVacuumSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if _, err := pool.Exec(ctx, "ALTER TABLE "+schema+".outbox_events SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	roles := outboxmigrate.Roles{Writer: outboxtest.UniqueName(t, "w"), Relay: outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"), Consumer: outboxtest.UniqueName(t, "c")}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
			_, _ = pool.Exec(context.Background(), "DROP ROLE "+r)
		})
	}
	role := roles.Relay
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	relayDB, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayDB.Close)

	var logs syncBuffer
	rc := quietConfig(schema, newNATS(t, outboxtest.NATSURL(), 0).pub)
	rc.VacuumInterval = 20 * time.Millisecond
	rc.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	_, stop := startRelay(t, relayDB, rc)
	outboxtest.Eventually(t, 30*time.Second, "the relay says it cannot vacuum", func() bool {
		return strings.Contains(logs.String(), "cannot vacuum them")
	})
	time.Sleep(100 * time.Millisecond) // five more intervals: nothing more to say
	stop()
	out := logs.String()
	if n := strings.Count(out, "cannot vacuum them"); n != 1 || strings.Contains(out, "vacuumed the outbox tables") {
		t.Fatalf("relay log (want the warning once, no vacuum claimed):\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer written concurrently while the test reads it.
type syncBuffer = outboxtest.Buffer
