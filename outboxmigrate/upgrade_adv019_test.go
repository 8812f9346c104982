package outboxmigrate_test

// Migration 019 (enqueue_hold rewritten, f2e07cb): tests of the adv019
// hostile review.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdv019UpgradeKeepsEnqueueHoldAndTheWriterRole: on a database at 018
// whose roles were granted, migration 019 replaces enqueue_hold keeping
// everything but its body (owner, rights, no SECURITY DEFINER, no SET, its
// volatility and strictness), and the writer role, with EXECUTE on the
// write functions only, still makes later calls through the Go writer and
// through enqueue_many: accepted in order, refused out of order (the
// writer without aborting, enqueue_many with 55000), and still may not
// call enqueue_hold itself.
func TestAdv019UpgradeKeepsEnqueueHoldAndTheWriterRole(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := schemaAt(t, 18)
	roles := outboxmigrate.Roles{
		Writer:   outboxtest.UniqueName(t, "w"),
		Relay:    outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"),
		Consumer: outboxtest.UniqueName(t, "c"),
	}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // before the schema is dropped, after the role's pool closed
			ctx := context.Background()
			if _, err := pool.Exec(ctx, "DROP OWNED BY "+r); err != nil {
				t.Errorf("drop owned by %s: %v", r, err)
			}
			if _, err := pool.Exec(ctx, "DROP ROLE "+r); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		})
	}
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("apply grants: %v", err)
	}
	attrs := func() string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT concat_ws(' | ', p.proowner::regrole, coalesce(p.proacl::text, 'default'), p.prosecdef,
				coalesce(p.proconfig::text, 'no SET'), p.provolatile, p.proisstrict, p.proparallel, p.prorettype::regtype, l.lanname)
			FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE p.oid = ($1 || '.enqueue_hold(jsonb)')::regprocedure`, schema).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := attrs()
	migrateFrom(t, ctx, pool, schema, 19, 19)
	if after := attrs(); after != before {
		t.Fatalf("enqueue_hold before migration 019: %s\nafter: %s", before, after)
	}

	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = roles.Writer
	writerDB, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(writerDB.Close)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id string) outbox.Event {
		return outbox.Event{AggregateType: "order", AggregateID: id, Type: "Touched", Payload: []byte(`{}`)}
	}
	if err := pgx.BeginFunc(ctx, writerDB, func(tx pgx.Tx) error {
		if _, err := w.InsertTx(ctx, tx, ev("B")); err != nil {
			return err
		}
		if _, err := w.InsertTx(ctx, tx, ev("C"), ev("B")); err != nil {
			return err
		}
		if _, err := w.InsertTx(ctx, tx, ev("A")); !errors.Is(err, outbox.ErrInsertOrder) {
			t.Errorf("A after B and C, as the writer role: %v, want ErrInsertOrder", err)
		}
		_, err := w.InsertTx(ctx, tx, ev("B"), ev("D"))
		return err
	}); err != nil {
		t.Fatalf("the writer role's later calls: %v", err)
	}
	tx, err := writerDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	many := func(id string) string {
		return `SELECT count(*) FROM ` + schema + `.enqueue_many('[{"aggregate_type":"order","aggregate_id":"` + id + `","event_type":"Touched","payload":{}}]')`
	}
	for _, q := range []string{many("C"), many("E"), many("C")} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("as the writer role, %s: %v", q, err)
		}
	}
	_, err = tx.Exec(ctx, many("D"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Message, "(order/D)") {
		t.Fatalf("as the writer role, D after E: %v, want 55000 naming order/D", err)
	}
	_ = tx.Rollback(ctx)
	_, err = writerDB.Exec(ctx, "SELECT "+schema+".enqueue_hold('[]')")
	refused(t, err, "the writer role calls enqueue_hold after migration 019")
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_events").Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d events (%v), want 5", n, err)
	}
}
