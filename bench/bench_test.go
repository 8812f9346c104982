package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
)

// TestQuickRun runs every scenario at --quick sizes against the local
// PostgreSQL and NATS and checks the output's shape: every scenario is
// there, and each JSON object carries scenario, events_per_sec, p50_ms,
// p99_ms and ratio. It checks no target: the figures of a smoke run on a
// shared machine mean nothing.
func TestQuickRun(t *testing.T) {
	// In parallel with the module's other tests: each runs on schemas
	// and streams of its own, and checks what must hold on any machine,
	// not figures; most of their time is waiting on fixed durations.
	t.Parallel()
	o := options{quick: true, only: allGroups, sz: quickSizes(),
		databaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		natsURL:     envOr("NATS_URL", "nats://127.0.0.1:4222"), amqpURL: envOr("AMQP_URL", "amqp://127.0.0.1:5672/")}
	var logw io.Writer = io.Discard
	if testing.Verbose() {
		logw = os.Stderr
	}
	results, err := run(context.Background(), o, logw)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"write/order-only/1c", "write/order+event-sql/4c", "write/order+event-fn/4c", "write/order+event-lib/16c",
		"inbox/go/1c", "inbox/sql/16c",
		"relay/ours", "relay/naive-unordered", "relay/watermill-defaults", "relay/watermill-batch1000",
		"relay/ours-vs-watermill-batch1000", "relay/ours-10-hot-aggregates",
		"latency/commit-to-ack/polling", "latency/commit-to-ack/wakeup",
		"latency/write-16c/wakeup-off", "latency/write-16c/wakeup-notifier", "latency/write-16c/wakeup-in-tx",
		"scale/1-relay-processes", "scale/2-relay-processes", "scale/4-relay-processes", "memory/relay-peak-rss",
		"history/0-published-rows", "history/50k-published-rows", "idle/relay-queries-per-sec",
		"dest/nats/relay-ours", "dest/kafka/relay-ours", "dest/kafka/ours-10-hot-aggregates",
	}
	for _, d := range destinations {
		for _, sc := range []string{"relay-ours", "relay-naive", "commit-to-ack-wakeup", "ours-10-hot-aggregates", "naive-10-hot-aggregates"} {
			want = append(want, "dest/"+d.name+"/"+sc)
		}
	}
	got := map[string]bool{}
	for _, r := range results {
		got[r.Scenario] = true
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"scenario", "events_per_sec", "p50_ms", "p99_ms", "ratio"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%s: JSON has no %q: %s", r.Scenario, k, b)
			}
		}
	}
	for _, s := range want {
		if !got[s] {
			t.Errorf("scenario %s missing", s)
		}
	}
	var table strings.Builder
	printTable(&table, results)
	if !strings.Contains(table.String(), "relay/naive-unordered") {
		t.Errorf("table lacks the naive relay:\n%s", table.String())
	}
}

// TestQuickSoak runs the soak group (not in the default run) for a few
// seconds and checks its summary is there: one row per interval, the first
// and last intervals and the flatness ratios. Like TestQuickRun, it checks
// no target.
func TestQuickSoak(t *testing.T) {
	t.Parallel() // see TestQuickRun
	o := options{quick: true, only: []string{"soak"}, sz: quickSizes(),
		databaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		natsURL:     envOr("NATS_URL", "nats://127.0.0.1:4222"), amqpURL: envOr("AMQP_URL", "amqp://127.0.0.1:5672/")}
	var log strings.Builder
	results, err := run(context.Background(), o, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	got := map[string]Result{}
	for _, r := range results {
		got[r.Scenario] = r
	}
	for _, s := range []string{"soak/first-interval", "soak/last-interval", "soak/written-last-vs-first", "soak/published-last-vs-first",
		"soak/lag-p50-last-vs-first", "soak/lag-p99-last-vs-first", "soak/size-last-vs-middle", "soak/dead-tuples-last",
		"soak/drain-after-load"} {
		if _, ok := got[s]; !ok {
			t.Errorf("scenario %s missing", s)
		}
	}
	if r := got["soak/last-interval"]; r.EventsPerSec == nil || *r.EventsPerSec <= 0 || r.Value == nil || *r.Value <= 0 {
		t.Errorf("last interval without throughput or size: %+v", r)
	}
	if rows := strings.Count(log.String(), "\n| 0:0"); rows != 3 {
		t.Errorf("the final table has %d rows, want 3 (6s in 2s intervals):\n%s", rows, log.String())
	}
}
