package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// settleFixed turns on the assertion that failed on the relay before issue
// 24's fix (a settle lost with its connection waited for the lease: 11
// events waited more than 15 s, max 30.7 s, 6 republished a lease later).
// The fix is in: the assertion holds (OUTBOX_BENCH_SETTLE_FIXED is then
// redundant).
const settleFixed = true

// TestPressureShort is the CI version of two pressure cells of issue 24:
// busy relay connections killed (here ten times a second, so that some kills
// land on a settle) and a pinned xmin, each for a few seconds with a short
// recovery, against two `outbox relay` processes on a private cluster at
// 300 events/s over 200 aggregates. It asserts only what must hold on any
// machine: nothing lost, invented or reordered at the destination, and
// (with settleFixed) no event of the killed cell waits half a lease.
func TestPressureShort(t *testing.T) {
	t.Parallel() // see TestQuickRun
	sz := quickPressure()
	sz.relays = []string{"polling"}
	sz.cells = []string{"kill-busy", "xmin"}
	sz.rate, sz.aggregates, sz.writers = 300, 200, 8
	sz.cellDur = map[string]time.Duration{"kill-busy": 6 * time.Second, "xmin": 8 * time.Second}
	sz.recovery, sz.warmup, sz.killEvery = 3*time.Second, 2*time.Second, 100*time.Millisecond
	sz.drain = sz.lease + 20*time.Second
	o := options{quick: true, only: []string{"pressure"}, sz: quickSizes(),
		databaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		natsURL:     envOr("NATS_URL", "nats://127.0.0.1:4222")}
	o.sz.pressure = sz
	var log strings.Builder
	var logw io.Writer = &log
	if testing.Verbose() {
		logw = io.MultiWriter(&log, os.Stderr)
	}
	e, err := newEnv(context.Background(), o, logw)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	runs, walLevel, err := pressureRuns(context.Background(), e)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(runs) != 1 {
		t.Fatalf("%d runs, want 1\n%s", len(runs), log.String())
	}
	r := runs[0]
	t.Logf("\n%s", pressureTable(runs, sz, walLevel))
	strict := settleFixed || os.Getenv("OUTBOX_BENCH_SETTLE_FIXED") == "1"
	if r.leftOver != 0 {
		t.Errorf("%d committed events never reached the stream (waited %s after the writers stopped)", r.leftOver, sz.drain)
	}
	if n := len(r.l.phantoms); n != 0 {
		t.Errorf("%d phantom deliveries (events no committed transaction wrote)", n)
	}
	for _, st := range r.stats {
		if st.committed == 0 {
			t.Errorf("%s: no event committed", st.name)
		}
		if st.lost != 0 || st.outOfOrder != 0 {
			t.Errorf("%s: %d lost, %d out of order", st.name, st.lost, st.outOfOrder)
		}
		if st.name == "kill-busy" && st.kills == 0 {
			t.Errorf("kill-busy: no relay backend was killed: the cell tested nothing")
		}
		if st.cell == "kill-busy" && strict && (st.lateLease != 0 || st.republishedLease != 0) {
			t.Errorf("%s: %d events waited more than half a lease (%s), max %.0f ms; %d republished a lease later: a killed settle left its events leased",
				st.name, st.lateLease, sz.lease/2, st.max, st.republishedLease)
		}
	}
}
