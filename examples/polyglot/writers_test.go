package polyglot_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/chaos"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// psql is the machine's client, the one a reader runs writer.sql with.
const psql = "/usr/bin/psql"

// wroteReport is what each writer prints: [event id, order id, sequence]
// of every event it committed, and the ids of the events of its
// transactions that rolled back.
type wroteReport struct {
	Written    [][3]any `json:"written"`
	RolledBack []string `json:"rolled_back"`
}

// lastLine is the last non-empty line of a program's output.
func lastLine(out []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	return lines[len(lines)-1]
}

// TestPsqlWriter: writer.sql, run by psql, writes 20 orders and their
// OrderPlaced events in one transaction (enqueue_many), rolls back a
// cancellation (enqueue), pays every order in a third, and wakes the
// relays; what a relay publishes to JetStream holds I1-I5.
func TestPsqlWriter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	wrote := writeSQL(t, ctx, schema, 20)
	checkWriter(t, ctx, pool, schema, wrote, 20, 1)
}

// writeSQL runs writer.sql with psql on schema for orders orders.
func writeSQL(t *testing.T, ctx context.Context, schema string, orders int) wroteReport {
	t.Helper()
	if _, err := os.Stat(psql); err != nil {
		t.Fatalf("%s missing (%v): apt-get install postgresql-client", psql, err)
	}
	// Not run(): its failure message names the arguments, and the URL may hold a password.
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-At", "-v", "schema="+schema, "-v", fmt.Sprint("orders=", orders), "-f", "writer.sql", "-d", outboxtest.DatabaseURL())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("psql -f writer.sql: %v\n%s", err, stderr.String())
	}
	var wrote wroteReport
	if err := json.Unmarshal(lastLine(out), &wrote); err != nil {
		t.Fatalf("writer.sql's report: %v\n%s", err, out)
	}
	return wrote
}

// TestNodeWriter: writer.js (npm pg) writes 20 orders, each with its
// OrderPlaced and then its OrderPaid event in the order's transactions, and
// two transactions that roll back after their enqueue; what a relay
// publishes to JetStream holds I1-I5.
func TestNodeWriter(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("node_modules/pg"); err != nil {
		t.Fatalf("node_modules missing (%v): run .ci/setup, or npm ci in examples/polyglot", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	env := []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_SCHEMA=" + schema}
	var wrote wroteReport
	if err := json.Unmarshal(run(t, ctx, env, "node", "writer.js", "20"), &wrote); err != nil {
		t.Fatal(err)
	}
	checkWriter(t, ctx, pool, schema, wrote, 20, 2)
}

// checkWriter runs a relay from schema to a JetStream stream of the test's
// own until every event the writer committed is published, reads the stream
// back and checks the invariants on what it holds, the outbox table and the
// writer's orders table, against the writer's report.
func checkWriter(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, wrote wroteReport, orders, rolledBack int) {
	t.Helper()
	if len(wrote.Written) != 2*orders || len(wrote.RolledBack) != rolledBack {
		t.Fatalf("the writer reports %d events written and %d rolled back, want %d and %d", len(wrote.Written), len(wrote.RolledBack), 2*orders, rolledBack)
	}
	js, stream := relayToStream(t, ctx, pool, schema)
	outboxtest.Eventually(t, time.Minute, "the relay publishes every event", func() bool {
		var pending int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&pending)
		return err == nil && pending == 0
	})
	msgs := streamMessages(t, ctx, js, stream)

	var violations []string
	violate := func(inv, format string, args ...any) {
		violations = append(violations, inv+": "+fmt.Sprintf(format, args...))
	}
	// I5 (per aggregate, first deliveries in sequence order without a gap)
	// with the chaos harness's checker; it counts deliveries per event.
	delivered := chaos.DeliveryOrder(msgs, nil, violate)

	type event struct {
		order, typ string
		seq        int64
		published  bool
	}
	rows, err := pool.Query(ctx, `SELECT event_id, aggregate_id, event_type, aggregate_sequence, published_at IS NOT NULL FROM `+schema+`.outbox_events`)
	if err != nil {
		t.Fatal(err)
	}
	table := map[uuid.UUID]event{}
	var id uuid.UUID
	var e event
	if _, err := pgx.ForEachRow(rows, []any{&id, &e.order, &e.typ, &e.seq, &e.published}, func() error { table[id] = e; return nil }); err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	rows, err = pool.Query(ctx, `SELECT id, status FROM `+schema+`.polyglot_orders`)
	if err != nil {
		t.Fatal(err)
	}
	var oid, st string
	if _, err := pgx.ForEachRow(rows, []any{&oid, &st}, func() error { status[oid] = st; return nil }); err != nil {
		t.Fatal(err)
	}

	// I1: every committed order has its intents, once: each written event
	// is in the table as the writer reported it, and each order is paid
	// with one OrderPlaced and one OrderPaid.
	if len(status) != orders {
		violate("I1", "%d orders in the table, want %d", len(status), orders)
	}
	perOrder := map[string]map[string]int{}
	for id, e := range table {
		if perOrder[e.order] == nil {
			perOrder[e.order] = map[string]int{}
		}
		perOrder[e.order][e.typ]++
		if status[e.order] == "" {
			violate("I2", "event %s of order %s, which is not in the orders table", id, e.order)
		}
	}
	for o, s := range status {
		if n := perOrder[o]; s != "paid" || n["OrderPlaced"] != 1 || n["OrderPaid"] != 1 || len(n) != 2 {
			violate("I1", "order %s is %s with intents %v, want paid with one OrderPlaced and one OrderPaid", o, s, n)
		}
	}
	written := map[uuid.UUID]bool{}
	for _, w := range wrote.Written {
		id, err := uuid.Parse(fmt.Sprint(w[0]))
		if err != nil {
			t.Fatalf("the writer reports event id %v: %v", w[0], err)
		}
		written[id] = true
		e, ok := table[id]
		switch {
		case !ok:
			violate("I1", "event %s (order %v, sequence %v) committed but not in the outbox", id, w[1], w[2])
		case e.order != fmt.Sprint(w[1]) || fmt.Sprint(e.seq) != fmt.Sprint(w[2]):
			violate("I1", "event %s is order %s sequence %d in the outbox, the writer got %v sequence %v", id, e.order, e.seq, w[1], w[2])
		}
	}
	// I2: nothing of a rolled-back transaction, in the table or at the
	// destination; nothing the writer did not commit.
	for _, s := range wrote.RolledBack {
		id := uuid.MustParse(s)
		if _, ok := table[id]; ok {
			violate("I2", "event %s of a rolled-back transaction is in the outbox", id)
		}
		if delivered[id] > 0 {
			violate("I2", "event %s of a rolled-back transaction reached the destination", id)
		}
	}
	for id := range table {
		if !written[id] {
			violate("I2", "event %s is in the outbox but the writer did not commit it", id)
		}
	}
	// I3: every intent published and at the destination; I4 as far as the
	// destination goes: none twice (JetStream drops a copy by Nats-Msg-Id).
	for id, e := range table {
		if !e.published || delivered[id] == 0 {
			violate("I3", "event %s (order %s sequence %d): published %v, delivered %d times", id, e.order, e.seq, e.published, delivered[id])
		}
	}
	for id, n := range delivered {
		if n > 1 {
			violate("I4", "event %s is %d times in the stream", id, n)
		}
		if !written[id] {
			violate("I2", "event %s is in the stream but the writer did not commit it", id)
		}
	}
	for _, m := range msgs {
		if m.Headers["traceparent"] == "" {
			violate("wire", "event %s arrived without its traceparent header", m.ID)
		}
	}
	if len(violations) > 0 {
		t.Errorf("%d violations:\n%s", len(violations), strings.Join(violations, "\n"))
	}
	if len(msgs) != 2*orders {
		t.Errorf("%d messages in the stream, want %d", len(msgs), 2*orders)
	}
}

// relayToStream runs a relay from schema to a JetStream stream of the
// test's own until the test ends.
func relayToStream(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) (jetstream.JetStream, string) {
	t.Helper()
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatalf("NATS at %s: %v (run .ci/setup, or start nats-server -js)", outboxtest.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := outboxtest.UniqueName(t, "POLYGLOT")
	pub, err := outboxnats.NewPublisher(ctx, js, outboxnats.Config{Stream: stream, SubjectPrefix: stream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	runRelay(t, ctx, pool, schema, pub)
	return js, stream
}

// streamMessages reads every message of the stream, in the stream's order,
// decoded as a consumer decodes them.
func streamMessages(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) []outbox.Message {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for uint64(len(msgs)) < info.State.Msgs {
		batch, err := c.Fetch(int(info.State.Msgs)-len(msgs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			msg, err := outboxnats.Decode(m.Headers(), m.Data())
			if err != nil {
				t.Fatalf("stream message %d: %v", len(msgs), err)
			}
			msgs = append(msgs, msg)
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("read %d of the stream's %d messages, then nothing more", len(msgs), info.State.Msgs)
		}
	}
	return msgs
}
