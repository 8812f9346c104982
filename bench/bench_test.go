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
	o := options{quick: true, only: allGroups, sz: quickSizes(),
		databaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		natsURL:     envOr("NATS_URL", "nats://127.0.0.1:4222")}
	var logw io.Writer = io.Discard
	if testing.Verbose() {
		logw = os.Stderr
	}
	results, err := run(context.Background(), o, logw)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"write/order-only/1c", "write/order+event-sql/4c", "write/order+event-lib/16c",
		"relay/ours", "relay/naive-unordered", "relay/watermill-defaults", "relay/watermill-batch1000",
		"relay/ours-vs-watermill-batch1000", "relay/ours-10-hot-aggregates",
		"latency/commit-to-ack/polling", "latency/commit-to-ack/wakeup",
		"latency/write-16c/wakeup-off", "latency/write-16c/wakeup-notifier", "latency/write-16c/wakeup-in-tx",
		"scale/1-relay-processes", "scale/2-relay-processes", "scale/4-relay-processes", "memory/relay-peak-rss",
		"history/0-published-rows", "history/50k-published-rows", "idle/relay-queries-per-sec",
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
