// Package polyglot_test runs the example's Python writer and Node.js
// consumer against the real services: the writer enqueues through the SQL
// write API (python3-psycopg), a relay publishes to a JetStream stream of
// the test's own, and the consumer (npm nats and pg) applies each event
// through the SQL inbox. .ci/setup installs python3-psycopg and runs
// `npm ci` here.
package polyglot_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// python is Debian's interpreter, which python3-psycopg installs into
// (a python3 first on PATH, pyenv's say, may not see it).
const python = "/usr/bin/python3"

func run(t *testing.T, ctx context.Context, env []string, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	return out
}

// TestPythonWriterNodeConsumer: 20 orders (two events each, and two
// transactions that roll back after their enqueue) written from Python are
// published by the relay and applied by the Node.js consumer once each, in
// sequence order, and nothing rolled back is applied.
func TestPythonWriterNodeConsumer(t *testing.T) {
	t.Parallel()
	if err := exec.Command(python, "-c", "import psycopg").Run(); err != nil {
		t.Fatalf("%s cannot import psycopg (%v): run .ci/setup, or apt-get install python3-psycopg", python, err)
	}
	if _, err := os.Stat("node_modules/nats"); err != nil {
		t.Fatalf("node_modules missing (%v): run .ci/setup, or npm ci in examples/polyglot", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	env := []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_SCHEMA=" + schema, "NATS_URL=" + outboxtest.NATSURL()}

	var wrote struct {
		Written    [][3]any `json:"written"`
		RolledBack []string `json:"rolled_back"`
	}
	if err := json.Unmarshal(run(t, ctx, env, python, "writer.py", "20"), &wrote); err != nil {
		t.Fatal(err)
	}
	if len(wrote.Written) != 40 || len(wrote.RolledBack) != 2 {
		t.Fatalf("the writer wrote %d events and rolled back %d, want 40 and 2", len(wrote.Written), len(wrote.RolledBack))
	}

	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := outboxtest.UniqueName(t, "POLYGLOT")
	pub, err := outboxnats.NewPublisher(ctx, js, outboxnats.Config{Stream: stream, SubjectPrefix: stream})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }()

	var seen struct {
		Applied    int      `json:"apply"`
		OutOfOrder int      `json:"out_of_order"`
		Bad        []string `json:"bad"`
	}
	if err := json.Unmarshal(run(t, ctx, env, "node", "consumer.js", stream, "billing", "40"), &seen); err != nil {
		t.Fatal(err)
	}
	if seen.Applied != 40 || seen.OutOfOrder != 0 || len(seen.Bad) != 0 {
		t.Fatalf("the consumer: %+v; want 40 applied, none out of order, every attribute as documented", seen)
	}
	rows, err := pool.Query(ctx, `SELECT e.event_id::text, e.aggregate_id, e.sequence, count(*) OVER (PARTITION BY e.event_id)
		FROM `+schema+`.polyglot_effects e ORDER BY e.aggregate_id, e.sequence`)
	if err != nil {
		t.Fatal(err)
	}
	type effect struct {
		id, agg string
		seq     int64
		n       int
	}
	effects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effect, error) {
		var e effect
		return e, r.Scan(&e.id, &e.agg, &e.seq, &e.n)
	})
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]bool{}
	for _, e := range effects {
		if e.n != 1 {
			t.Errorf("event %s applied %d times", e.id, e.n)
		}
		applied[e.id] = true
	}
	for _, w := range wrote.Written {
		if id := w[0].(string); !applied[id] {
			t.Errorf("event %s (order %v, sequence %v) written but not applied", id, w[1], w[2])
		}
	}
	for _, id := range wrote.RolledBack {
		if applied[id] {
			t.Errorf("event %s of a rolled-back transaction was applied", id)
		}
	}
	if len(effects) != len(wrote.Written) {
		t.Errorf("%d effects for %d events written", len(effects), len(wrote.Written))
	}
}
