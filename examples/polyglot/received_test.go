package polyglot_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// aggregates are the orders the consumer tests write: one id with a space, a
// slash and a non-ASCII letter, which every binding must carry unchanged,
// and one with a JSON content type of its own.
var aggregates = []struct{ id, contentType string }{
	{"o-1", ""}, {"o 2/é", ""}, {"o-3", "application/vnd.shop+json"}, {"o-4", ""},
}

// steps are each order's events, in order: every aggregate gets all three.
var steps = []string{"OrderPlaced", "OrderPaid", "OrderShipped"}

// writeOrders writes len(aggregates)×len(steps) events with the Go Writer,
// one transaction per event, aggregates interleaved, each with a traceparent
// header of its own, and one transaction per aggregate that rolls back after
// its insert. It returns the ids of the rolled-back events.
func writeOrders(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) (rolledBack []string) {
	t.Helper()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	insert := func(agg int, typ string, commit bool) (string, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return "", err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		trace := make([]byte, 24)
		if _, err := rand.Read(trace); err != nil {
			return "", err
		}
		a := aggregates[agg]
		recs, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: a.id, Type: typ, ContentType: a.contentType,
			Payload: []byte(fmt.Sprintf(`{"order":%q,"step":%q}`, a.id, typ)),
			Headers: map[string]string{"traceparent": "00-" + hex.EncodeToString(trace[:16]) + "-" + hex.EncodeToString(trace[16:]) + "-01"}})
		if err != nil {
			return "", err
		}
		if commit {
			return recs[0].ID.String(), tx.Commit(ctx)
		}
		return recs[0].ID.String(), nil // rolled back
	}
	for i, typ := range steps {
		for agg := range aggregates {
			if i == 1 { // a transaction that rolls back: its event must never be applied
				id, err := insert(agg, "OrderCancelled", false)
				if err != nil {
					t.Fatal(err)
				}
				rolledBack = append(rolledBack, id)
			}
			if _, err := insert(agg, typ, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	return rolledBack
}

// expected is the number of events writeOrders commits.
var expected = len(aggregates) * len(steps)

// received is one event as a consumer decoded and applied it (its
// polyglot_received row, written by inbox.js in the inbox's transaction),
// or as the outbox table says it must be.
type received struct {
	ID, AggregateType, AggregateID string
	Sequence                       int64
	Type, Source                   string
	Time                           time.Time
	ContentType, PartitionKey      string
	Traceparent                    string
	Data                           string
}

// checkReceived asserts from the database that consumer applied every
// committed event exactly once, in sequence order per aggregate, none of
// rolledBack, and that every attribute it decoded is the documented one:
// wantPartitionKey says whether the binding carries a partition key (the
// aggregate id); timeUnit is the precision the client library keeps of
// the event's time.
func checkReceived(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema, consumer string, rolledBack []string, wantPartitionKey bool, timeUnit time.Duration) {
	t.Helper()
	want := map[string]received{}
	rows, err := pool.Query(ctx, `SELECT event_id::text, aggregate_type, aggregate_id, aggregate_sequence, event_type, occurred_at,
		coalesce(content_type, 'application/json'), headers->>'traceparent', coalesce(convert_from(payload_bytes, 'UTF8'), payload::text)
		FROM `+schema+`.outbox_events`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var r received
		if err := rows.Scan(&r.ID, &r.AggregateType, &r.AggregateID, &r.Sequence, &r.Type, &r.Time, &r.ContentType, &r.Traceparent, &r.Data); err != nil {
			t.Fatal(err)
		}
		r.Source = source
		if wantPartitionKey {
			r.PartitionKey = r.AggregateID
		}
		want[r.ID] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) != expected {
		t.Fatalf("the outbox holds %d events, want %d", len(want), expected)
	}

	rows, err = pool.Query(ctx, `SELECT event_id::text, aggregate_type, aggregate_id, sequence, type, source, time,
		datacontenttype, coalesce(partitionkey, ''), coalesce(traceparent, ''), data
		FROM `+schema+`.polyglot_received WHERE consumer = $1 ORDER BY applied`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (received, error) {
		var g received
		var tm string
		if err := r.Scan(&g.ID, &g.AggregateType, &g.AggregateID, &g.Sequence, &g.Type, &g.Source, &tm, &g.ContentType,
			&g.PartitionKey, &g.Traceparent, &g.Data); err != nil {
			return g, err
		}
		var err error
		g.Time, err = time.Parse(time.RFC3339Nano, tm)
		if err != nil {
			return g, fmt.Errorf("event %s: time %q is not RFC 3339: %w", g.ID, tm, err)
		}
		return g, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range rolledBack {
		if _, ok := want[id]; ok {
			t.Errorf("event %s of a rolled-back transaction is in the outbox", id)
		}
	}
	applied := map[string]int{}
	last := map[string]int64{}
	for _, g := range got {
		applied[g.ID]++
		if g.Sequence != last[g.AggregateID]+1 {
			t.Errorf("aggregate %q: sequence %d applied after %d", g.AggregateID, g.Sequence, last[g.AggregateID])
		}
		last[g.AggregateID] = g.Sequence
		w, ok := want[g.ID]
		if !ok {
			t.Errorf("event %s applied, but the outbox holds no such committed event (rolled back?)", g.ID)
			continue
		}
		if !g.Time.Equal(w.Time.Truncate(timeUnit)) {
			t.Errorf("event %s: time %s, want %s (occurred_at, to the %s)", g.ID, g.Time.Format(time.RFC3339Nano), w.Time.UTC().Format(time.RFC3339Nano), timeUnit)
		}
		if !sameJSON(g.Data, w.Data) {
			t.Errorf("event %s: data %s, want %s", g.ID, g.Data, w.Data)
		}
		g.Time, w.Time, g.Data, w.Data = time.Time{}, time.Time{}, "", ""
		if g != w {
			t.Errorf("event %s decoded as\n%+v\nwant\n%+v", g.ID, g, w)
		}
	}
	for id, w := range want {
		if applied[id] != 1 {
			t.Errorf("event %s (%s #%d) applied %d times, want once", id, w.AggregateID, w.Sequence, applied[id])
		}
	}
}

func sameJSON(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// nodeReport is the JSON line a node program prints at its end: the inbox's
// answers, applied events out of order, and attributes not as documented.
type nodeReport struct {
	Applied    int      `json:"apply"`
	OutOfOrder int      `json:"out_of_order"`
	Bad        []string `json:"bad"`
	Refused    int      `json:"refused"`
}

// checkReport fails the test unless the program applied every event, in
// order, with every attribute as documented.
func checkReport(t *testing.T, r nodeReport) {
	t.Helper()
	if r.Applied != expected || r.OutOfOrder != 0 || len(r.Bad) != 0 {
		t.Errorf("the consumer reports %+v; want %d applied, none out of order, every attribute as documented", r, expected)
	}
}

// needNodeModules fails the test when npm ci has not run here.
func needNodeModules(t *testing.T, pkgs ...string) {
	t.Helper()
	for _, p := range pkgs {
		if _, err := os.Stat("node_modules/" + p); err != nil {
			t.Fatalf("node_modules/%s missing (%v): run .ci/setup, or npm ci in examples/polyglot", p, err)
		}
	}
}

// startNode starts a node program and returns a channel of its stdout
// lines and a function that waits for it to exit (failing the test with
// its stderr when it did not exit cleanly).
func startNode(t *testing.T, ctx context.Context, env []string, args ...string) (<-chan string, func()) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("node %v: %v (install Node.js 20: .ci/setup)", args, err)
	}
	lines := make(chan string, 16)
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	wait := func() {
		t.Helper()
		<-read
		if err := cmd.Wait(); err != nil {
			t.Fatalf("node %v: %v\n%s", args, err, stderr.String())
		}
	}
	return lines, wait
}

// lastJSON decodes the last line a node program printed into v.
func lastJSON(t *testing.T, lines <-chan string, wait func(), v any) {
	t.Helper()
	var last string
	for l := range lines {
		if strings.TrimSpace(l) != "" {
			last = l
		}
	}
	wait()
	if err := json.Unmarshal([]byte(last), v); err != nil {
		t.Fatalf("the program's last line %q: %v", last, err)
	}
}

// runRelay runs a relay of schema publishing through pub until the test ends.
func runRelay(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, pub outbox.Publisher) {
	t.Helper()
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(relayCtx) }()
	t.Cleanup(func() { stop(); <-done })
}

// nodeEnv is the environment every node program gets: the database and schema.
func nodeEnv(schema string) []string {
	return []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_SCHEMA=" + schema}
}

func itoa(n int) string { return strconv.Itoa(n) }
