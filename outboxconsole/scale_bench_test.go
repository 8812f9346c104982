package outboxconsole_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// queryLog records the statements run on a pool, with their arguments.
type queryLog struct {
	mu sync.Mutex
	qs []loggedQuery
}

type loggedQuery struct {
	sql  string
	args []any
}

func (l *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	l.qs = append(l.qs, loggedQuery{d.SQL, d.Args})
	l.mu.Unlock()
	return ctx
}
func (l *queryLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *queryLog) take() []loggedQuery {
	l.mu.Lock()
	defer l.mu.Unlock()
	qs := l.qs
	l.qs = nil
	return qs
}

// seedMillion writes a backlog of a million pending events (100,000
// aggregates of 10), quarantines the head of 2,000 aggregates (18,000
// events blocked behind them), and adds 120,000 events published over the
// last hour, 10,000 audit rows and 200,000 inbox marks of which 5,000
// wait on a gap, all with
// generate_series.
func seedMillion(b *testing.B, pool *pgxpool.Pool, schema string) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO ` + schema + `.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
SELECT gen_random_uuid(), 'order', 'ord-' || (g % 100000), g / 100000 + 1, 'OrderCreated', jsonb_build_object('n', g), now() - interval '2 hours' + g * interval '1 ms'
FROM generate_series(0, 999999) g`,
		`UPDATE ` + schema + `.outbox_events SET quarantined_at = now() - random() * interval '1 hour', attempt_count = 5, last_error = 'permanent: refused'
WHERE aggregate_sequence = 1 AND aggregate_id IN (SELECT 'ord-' || g FROM generate_series(0, 1999) g)`,
		`UPDATE ` + schema + `.outbox_events SET available_at = 'infinity'
WHERE aggregate_sequence > 1 AND aggregate_id IN (SELECT 'ord-' || g FROM generate_series(0, 1999) g)`,
		`INSERT INTO ` + schema + `.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, published_at)
SELECT gen_random_uuid(), 'payment', 'pay-' || g, 1, 'PaymentCaptured', '{}', now() - interval '61 minutes', now() - g * interval '30 ms'
FROM generate_series(1, 120000) g`,
		`INSERT INTO ` + schema + `.outbox_operations (action, actor, reason) SELECT 'skip', 'op', 'seeded ' || g FROM generate_series(1, 10000) g`,
		`INSERT INTO ` + schema + `.inbox_aggregates (consumer_name, aggregate_type, aggregate_id, last_sequence, waiting_since, waiting_for, waiting_seen)
SELECT 'inventory', 'order', 'ord-' || g, 1, CASE WHEN g % 40 = 0 THEN now() - g * interval '1 ms' END,
	CASE WHEN g % 40 = 0 THEN 2 END, CASE WHEN g % 40 = 0 THEN 3 END FROM generate_series(1, 200000) g`,
		`ANALYZE ` + schema + `.outbox_events`,
		`ANALYZE ` + schema + `.outbox_operations`,
		`ANALYZE ` + schema + `.inbox_aggregates`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("seed: %v\n%s", err, q)
		}
	}
}

// planScans returns the tables a statement's plan reads whole (Seq Scan).
func planScans(b *testing.B, pool *pgxpool.Pool, q loggedQuery) []string {
	b.Helper()
	var raw []byte
	if err := pool.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+q.sql, q.args...).Scan(&raw); err != nil {
		b.Fatalf("explain: %v\n%s", err, q.sql)
	}
	var plans []struct{ Plan map[string]any }
	if err := json.Unmarshal(raw, &plans); err != nil {
		b.Fatal(err)
	}
	var scans []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Node Type"] == "Seq Scan" {
			scans = append(scans, n["Relation Name"].(string))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	for _, p := range plans {
		walk(p.Plan)
	}
	return scans
}

// bigTable reports whether scans name a table that grows with the backlog,
// the history or the consumers.
func bigTable(scans []string) bool {
	for _, t := range scans {
		switch t {
		case "outbox_events", "outbox_aggregates", "outbox_operations", "processed_events", "inbox_aggregates":
			return true
		}
	}
	return false
}

// BenchmarkConsolePagesMillionPending renders each page of the console over
// a backlog of a million pending events. Before timing, it checks that the
// list pages' statements read no table whole (each reads a page from an
// index); the overview's backlog counts are the one pass over the
// unsettled rows that `outbox status` makes (Admin.Status), and its backlog
// chart another (Admin.History), so its time is about twice the status's.
func BenchmarkConsolePagesMillionPending(b *testing.B) {
	pool0, schema := outboxtest.Schema(b)
	seedMillion(b, pool0, schema)
	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		b.Fatal(err)
	}
	log := &queryLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	// PublicRead: the pages need no login, so that the plain GETs below
	// render them (with a token and no session they would be sent to the
	// login page, which reads nothing).
	h, err := outboxconsole.New(outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken, PublicRead: true, Logger: discard()})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, body)
		}
	}
	var someID string
	if err := pool0.QueryRow(context.Background(), `SELECT event_id::text FROM `+schema+`.outbox_events
WHERE aggregate_type = 'order' AND aggregate_id = 'ord-5000' AND aggregate_sequence = 4`).Scan(&someID); err != nil {
		b.Fatal(err)
	}
	cursor := func(v any) string {
		raw, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(raw)
	}
	pages := []string{"/", "/quarantine", "/quarantine?after=2026-01-01T00:00:00Z_00000000-0000-0000-0000-000000000000", "/inbox", "/operations", "/operations?before=5000", "/sideeffects", "/sideeffects?show=open", "/sideeffects?show=waiting",
		// Finding an event: by id, by aggregate (its lane, then a page of
		// its events), by type (a bounded walk: a common type, one that
		// is not there, the settled ones, and later pages of each).
		"/events?id=" + someID, "/events/" + someID, "/events/" + someID + "/payload",
		"/events?aggregate_type=order&aggregate_id=ord-5000", "/events?aggregate_type=order&aggregate_id=ord-5000&after=3",
		"/events?aggregate_type=order&aggregate_id=ord-7",
		"/events?event_type=OrderCreated", "/events?event_type=NoSuchType",
		"/events?event_type=OrderCreated&after=" + cursor(map[string]any{"t": "order", "a": "ord-50000", "s": 3}),
		"/events?event_type=PaymentCaptured&scope=settled",
		"/events?event_type=PaymentCaptured&scope=settled&after=" + cursor(map[string]any{"p": time.Now().Add(-30 * time.Minute), "i": "ffffffff-ffff-ffff-ffff-ffffffffffff"}),
		// Bulk previews: by error text, and by type.
		"/quarantine/bulk?action=retry&error=refused", "/quarantine/bulk?action=skip&event_type=OrderCreated",
	}
	for _, page := range pages {
		log.take()
		start := time.Now()
		get(page)
		took := time.Since(start)
		qs := log.take()
		for _, q := range qs {
			if w := strings.ToLower(strings.Fields(q.sql)[0]); w != "select" && w != "with" {
				continue // begin, commit
			}
			scans := planScans(b, pool0, q)
			if len(scans) == 0 {
				continue
			}
			if !bigTable(scans) {
				continue // relays, catalogs: a few rows
			}
			if page == "/" && strings.Contains(q.sql, "GROUP BY e.aggregate_type") {
				b.Logf("%s: the status's backlog pass reads %v whole (expected at this backlog)", page, scans)
				continue
			}
			if page == "/" && strings.Contains(q.sql, "-- history: the pass over the backlog") {
				b.Logf("%s: the backlog chart's pass (Admin.History) reads %v whole (expected at this backlog)", page, scans)
				continue
			}
			b.Fatalf("%s: a statement reads %v whole:\n%s", page, scans, q.sql)
		}
		b.Logf("%s: %d statements, first render %s", page, len(qs), took.Round(time.Millisecond))
	}
	for _, page := range []struct{ name, path string }{{"overview", "/"}, {"quarantine", "/quarantine"}, {"inbox", "/inbox"}, {"operations", "/operations"},
		{"event", "/events/" + someID}, {"lane", "/events?aggregate_type=order&aggregate_id=ord-5000"}, {"type", "/events?event_type=OrderCreated"},
		{"type-absent", "/events?event_type=NoSuchType"}, {"bulk-preview", "/quarantine/bulk?action=retry&error=refused"}} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				get(page.path)
			}
		})
	}
}
