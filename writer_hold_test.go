package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestInsertTxLaterCallsReadHeldOnce: a transaction's later InsertTx call
// costs the database a pass over the aggregates the transaction holds plus
// those the call names, not their product. Both checks of a later call
// (the writer's, which refuses without aborting the transaction, and
// enqueue_hold's inside enqueue_many) used to look each of the call's
// aggregates up in the held array with jsonb_exists, a scan of the array
// per aggregate: a transaction of 200 calls of 1,000 new aggregates (the
// fleet's isolation figure writing its 200,000-event backlog) ran for over
// ten minutes. Now each finds the largest held aggregate once and looks up
// only the aggregates sorting before it, in a hash built once.
//
// Not a timed test: auto_explain sends the plan of every statement of the
// calls, those inside the functions included, with the rows each node
// produced; the test bounds their sum by a multiple of held + named, and
// refuses a membership test that scans the array (jsonb_exists, ?) in any
// plan.
func TestInsertTxLaterCallsReadHeldOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)

	var mu sync.Mutex
	var plans []string
	recording := false
	cfg := pool.Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if i := strings.Index(n.Message, "plan:"); recording && i >= 0 {
			plans = append(plans, n.Message[i+len("plan:"):])
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `LOAD 'auto_explain'`); err != nil {
		t.Fatal(err)
	}

	const held, named = 1000, 1000
	events := func(prefix string, n int) []outbox.Event {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = orderEvent(fmt.Sprintf("%s-%05d", prefix, i), "Touched")
		}
		return evs
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := w.InsertTx(ctx, tx, events("b", held)...); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL auto_explain.log_min_duration = 0; SET LOCAL auto_explain.log_analyze = on;
		SET LOCAL auto_explain.log_timing = off; SET LOCAL auto_explain.log_nested_statements = on;
		SET LOCAL auto_explain.log_format = json; SET LOCAL auto_explain.log_level = notice`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	recording = true
	mu.Unlock()
	// New aggregates sorting after every one held, then the held ones again
	// (each looked up), then one new aggregate sorting before them: refused.
	if _, err := w.InsertTx(ctx, tx, events("c", named)...); err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx, events("b", named)...); err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx, orderEvent("a", "Touched")); !errors.Is(err, outbox.ErrInsertOrder) {
		t.Fatalf("a new aggregate sorting before those held: %v, want ErrInsertOrder", err)
	}
	mu.Lock()
	recording = false
	got := plans
	mu.Unlock()
	if _, err := tx.Exec(ctx, `SET LOCAL auto_explain.log_min_duration = -1`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, pool, schema); n != held+2*named {
		t.Fatalf("%d events, want %d", n, held+2*named)
	}

	if len(got) == 0 {
		t.Fatal("auto_explain sent no plan")
	}
	var rows float64
	hashed := false
	for _, p := range got {
		var doc struct {
			Query string         `json:"Query Text"`
			Plan  map[string]any `json:"Plan"`
		}
		if err := json.Unmarshal([]byte(p), &doc); err != nil {
			t.Fatalf("plan %q: %v", p, err)
		}
		walkPlan(doc.Plan, func(node map[string]any) {
			r, _ := node["Actual Rows"].(float64)
			l, _ := node["Actual Loops"].(float64)
			rows += r * l
			for _, k := range []string{"Filter", "Join Filter", "One-Time Filter"} {
				f, _ := node[k].(string)
				if strings.Contains(f, "jsonb_exists") || strings.Contains(f, " ? ") {
					t.Errorf("a statement looks aggregates up by scanning an array (%s: %s) in:\n%s", k, f, doc.Query)
				}
				hashed = hashed || strings.Contains(f, "hashed SubPlan")
			}
		})
	}
	// Three calls: 2,001 aggregates named, 1,000 then 2,000 held. About 30
	// rows per event go through the nodes of enqueue_many's statements
	// (input, counts, counter rows, events, and their joins); a lookup per
	// aggregate that scanned what is held would add named × held.
	if limit := 60.0 * (held + 2*named); rows > limit {
		t.Errorf("the later calls' statements produced %.0f rows, want at most %.0f: something is done per aggregate per aggregate held", rows, limit)
	}
	if !hashed {
		t.Error("no plan looked the held aggregates up in a hash")
	}
	t.Logf("%d plans, %.0f rows", len(got), rows)
}

// walkPlan calls f on node and every node under it (its Plans: children,
// InitPlans and SubPlans).
func walkPlan(node map[string]any, f func(map[string]any)) {
	f(node)
	children, _ := node["Plans"].([]any)
	for _, c := range children {
		if m, ok := c.(map[string]any); ok {
			walkPlan(m, f)
		}
	}
}

// TestEnqueueLaterCallsOrder: the SQL door's rule for a transaction's later
// calls (docs/sql-api.md, "Several calls in one transaction"), as
// enqueue_hold checks it: aggregates held already and aggregates sorting
// after all of them are accepted, in any order within a call; a call naming
// one that sorts before an aggregate held, and is not held, is refused
// with 55000 naming the first such in the call's order, before it writes
// anything.
func TestEnqueueLaterCallsOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	many := func(ids ...string) string {
		var evs []string
		for _, id := range ids {
			evs = append(evs, `{"aggregate_type":"order","aggregate_id":"`+id+`","event_type":"Touched","payload":{}}`)
		}
		return `SELECT count(*) FROM ` + schema + `.enqueue_many('[` + strings.Join(evs, ",") + `]')`
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		`SELECT count(*) FROM ` + schema + `.enqueue('order', 'B', 'Touched', '{}'::text)`,
		many("D", "C"),      // after B
		many("B"),           // held
		many("C", "B", "E"), // held, and E after D
		many("E", "F", "E"), // held, and F after E
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, c := range []struct {
		ids  []string
		bad  string
		want int // events after the refused call (none written by it)
	}{
		{[]string{"A"}, "order/A", 10},
		{[]string{"F", "BB", "A", "G"}, "order/BB", 10},
	} {
		if _, err := tx.Exec(ctx, `SAVEPOINT s`); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(ctx, many(c.ids...))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Message, "("+c.bad+")") {
			t.Errorf("enqueue_many of %v after F: %v, want 55000 naming %s", c.ids, err, c.bad)
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT s`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events`).Scan(&n); err != nil || n != c.want {
			t.Fatalf("%d events after the refused call of %v (%v), want %d", n, c.ids, err, c.want)
		}
	}
	if _, err := tx.Exec(ctx, many("G", "F")); err != nil {
		t.Fatalf("G and F after the refusals: %v", err)
	}
	var seq int64
	if err := tx.QueryRow(ctx, `SELECT max(aggregate_sequence) FROM `+schema+`.outbox_events WHERE aggregate_id = 'E'`).Scan(&seq); err != nil || seq != 3 {
		t.Fatalf("order/E's last sequence %d (%v), want 3", seq, err)
	}
}
