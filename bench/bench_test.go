package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
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
		"relay/ours", "relay/naive-unordered", "relay/ours-vs-watermill-best", "relay/ours-10-hot-aggregates",
		"latency/commit-to-ack/polling", "latency/commit-to-ack/wakeup",
		"latency/write-16c/wakeup-off", "latency/write-16c/wakeup-notifier", "latency/write-16c/wakeup-in-tx",
		"scale/1-relay-processes", "scale/2-relay-processes", "memory/relay-peak-rss",
		"history/0-published-rows", "history/20k-published-rows", "idle/relay-queries-per-sec",
		"dest/nats/relay-ours", "dest/kafka/relay-ours", "dest/kafka/ours-10-hot-aggregates",
	}
	for _, v := range o.sz.watermill {
		want = append(want, "relay/watermill-"+v)
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
	checkSmokeHeadlines(t, results, table.String())
}

// checkSmokeHeadlines checks that a --quick run prints no headline: no
// target checked, the Watermill comparison and ours beside the naive relay
// without a ratio and saying why, and the table opening with the notice.
func checkSmokeHeadlines(t *testing.T, results []Result, table string) {
	t.Helper()
	for _, r := range results {
		if !r.Smoke || r.Met != nil {
			t.Errorf("%s: smoke %v, met %v: a --quick result must be marked smoke and check no target", r.Scenario, r.Smoke, r.Met)
		}
		switch r.Scenario {
		case "relay/ours-vs-watermill-best", "relay/ours":
			if r.Ratio != nil || !strings.Contains(r.Note, "sizes too small for a comparison") {
				t.Errorf("%s: ratio %s, note %q: a smoke run's drains cannot support it", r.Scenario, ratioText(r.Ratio), r.Note)
			}
		}
	}
	if !strings.HasPrefix(table, "smoke run (--quick):") {
		t.Errorf("the table does not open with the smoke notice:\n%s", table)
	}
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "relay/ours-vs-watermill-best" {
			// scenario, events/s, p50, p99, max, value, ratio: all "-"
			if len(f) < 7 || f[6] != "-" {
				t.Errorf("the headline's row prints a ratio: %q", line)
			}
		}
	}
}

// TestCompareNeedsSize: a ratio is printed only when both sides were
// measured over enough events and time; otherwise the note says why.
func TestCompareNeedsSize(t *testing.T) {
	big := sample{events: 400_000, seconds: 20}
	for _, tc := range []struct {
		name         string
		mine, theirs sample
		smoke        bool
		ratio        bool
	}{
		{"full run", big, sample{events: 150_000, seconds: 40}, false, true},
		{"a slow peer over 30 s", big, sample{events: 17_100, seconds: 30}, false, true},
		{"at the limits", sample{events: minFigureEvents, seconds: minFigureSeconds}, big, false, true},
		{"quick drain of ours", sample{events: 10_000, seconds: 0.5}, big, false, false},
		{"quick Watermill", big, sample{events: 5_001, seconds: 1.4}, false, false},
		{"many events, too short", sample{events: 50_000, seconds: 1.9}, big, false, false},
		{"long, too few events", big, sample{events: 9_999, seconds: 40}, false, false},
		{"smoke run with big enough drains", big, big, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Result{Scenario: "x", Note: "n"}
			r.compare(tc.smoke, 5.3, "y", tc.mine, tc.theirs)
			if r.RatioOf != "y" {
				t.Errorf("ratio_of %q, want y", r.RatioOf)
			}
			if tc.ratio {
				if r.Ratio == nil || *r.Ratio != 5.3 || r.Note != "n" {
					t.Errorf("ratio %s, note %q: want 5.3 and the note unchanged", ratioText(r.Ratio), r.Note)
				}
				return
			}
			if r.Ratio != nil {
				t.Errorf("ratio %s printed over %s beside %s", ratioText(r.Ratio), tc.mine, tc.theirs)
			}
			want := "n; sample too small for a comparison with y"
			if tc.smoke {
				want = "n; smoke run: sizes too small for a comparison with y"
			}
			if !strings.HasPrefix(r.Note, want) {
				t.Errorf("note %q does not say why (want it to start with %q)", r.Note, want)
			}
		})
	}
}

// TestQuickSoak runs the soak group (not in the default run) for a few
// seconds, the DELETE and the partitioned outbox one after the other on a
// private cluster with autovacuum off, and checks its summary is there:
// one row per interval for each, the windows compared, the figures per
// event (pg_stat_statements, the WAL, the cluster's CPU), and that the
// partitioned outbox lost settled partitions to the drop rather than rows
// to a DELETE. Like TestQuickRun, it checks no target.
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
	for _, kind := range []string{"delete", "partitioned"} {
		p := "soak/" + kind + "/autovacuum-off/"
		for _, s := range []string{"first-interval", "last-interval", "published-last-vs-first", "size-last-vs-second-window",
			"claim-p99-last-vs-second-window", "vacuums-of-outbox-events", "dead-tuples-last", "wal-bytes-per-event",
			"index-bytes-per-event", "drain-after-load", "pg-cpu-per-event", "statements/write", "statements/claim", "statements/mark",
			"statements/clean-up"} {
			if _, ok := got[p+s]; !ok {
				t.Errorf("scenario %s missing", p+s)
			}
		}
		if r := got[p+"last-interval"]; r.EventsPerSec == nil || *r.EventsPerSec <= 0 || r.Value == nil || *r.Value <= 0 {
			t.Errorf("%s: last interval without throughput or size: %+v", kind, r)
		}
		if r := got[p+"wal-bytes-per-event"]; r.Value == nil || *r.Value <= 0 {
			t.Errorf("%s: no WAL per event: %+v", kind, r)
		}
	}
	if _, ok := got["soak/partitioned/autovacuum-off/wal-per-event-vs-delete"]; !ok {
		t.Errorf("no WAL ratio of the partitioned outbox to the DELETE path")
	}
	if rows := strings.Count(log.String(), "\n| 0:0"); rows != 6 {
		t.Errorf("the final tables have %d rows, want 6 (twice 6s in 2s intervals):\n%s", rows, log.String())
	}
	if !strings.Contains(log.String(), "soak summary:") {
		t.Errorf("no summary table:\n%s", log.String())
	}
	// 1-second partitions, a 2-second horizon, 6 seconds of load: the
	// upkeep drops the first partitions within the run.
	if !regexp.MustCompile(`clean-up by partition drop \([1-9][0-9]* dropped\)`).MatchString(log.String()) {
		t.Errorf("the partitioned soak dropped no partition:\n%s", log.String())
	}
}

func ratioText(p *float64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// TestQuickSizing runs the sizing group (not in the default run) at
// --quick sizes and checks its table: every stage of both outbox kinds is
// there, the write, the claim and mark and the clean-up each cost the
// server's backends CPU and wrote WAL (the readings by application_name
// found the stage's backends), the partitioned outbox dropped partitions
// rather than deleting rows, and a total per kind. Like TestQuickRun, it
// checks no figure against a target.
func TestQuickSizing(t *testing.T) {
	t.Parallel() // see TestQuickRun
	o := options{quick: true, only: []string{"sizing"}, sz: quickSizes(),
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
	stages := map[string][]string{
		"delete":      {"write-steady", "claim+mark-steady", "claim-steady", "mark-steady", "write-backlog", "claim+mark-drain", "claim-drain", "mark-drain", "clean-up-DELETE", "VACUUM-outbox_events", "VACUUM-outbox_aggregates", "total-steady-path"},
		"partitioned": {"write-steady", "claim+mark-steady", "write-backlog", "claim+mark-drain", "partition-drop", "VACUUM-outbox_aggregates", "total-steady-path"},
	}
	for kind, names := range stages {
		for _, n := range names {
			r, ok := got["sizing/"+kind+"/"+n]
			if !ok {
				t.Errorf("sizing/%s/%s missing", kind, n)
				continue
			}
			if r.Events <= 0 || r.Value == nil {
				t.Errorf("sizing/%s/%s: %d events, value %v", kind, n, r.Events, r.Value)
			}
		}
		// The stages whose backends must have run: the CPU of a few
		// thousand writes or claims is more than one 10 ms tick.
		for _, n := range []string{"write-backlog", "claim+mark-drain", "total-steady-path"} {
			if r := got["sizing/"+kind+"/"+n]; r.Value == nil || *r.Value <= 0 {
				t.Errorf("sizing/%s/%s: no backend CPU (%v): the readings missed the stage's backends", kind, n, r.Value)
			}
		}
		for _, n := range []string{"write-backlog", "claim+mark-drain"} {
			if r := got["sizing/"+kind+"/"+n]; !strings.Contains(r.Note, "WAL ") || strings.Contains(r.Note, "WAL 0 B") {
				t.Errorf("sizing/%s/%s: no WAL: %q", kind, n, r.Note)
			}
		}
	}
	if r := got["sizing/partitioned/partition-drop"]; !regexp.MustCompile(`[1-9][0-9]* partitions of 1s dropped`).MatchString(r.Note) {
		t.Errorf("the partitioned outbox dropped no partition: %q", r.Note)
	}
	if r := got["sizing/delete/clean-up-DELETE"]; r.Events <= 0 {
		t.Errorf("the DELETE clean-up deleted nothing: %+v", r)
	}
	if !strings.Contains(log.String(), "| outbox | stage | events | backends CPU µs/event |") {
		t.Errorf("no sizing table:\n%s", log.String())
	}
}
