package chaos

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// runChaosCommand runs "outbox chaos" of bins as a process and returns its
// output and exit code. The runs but TestChaosRunAMQP's and TestChaosRunKafka's are parallel
// tests: each has its schema, its destination (NATS, kfake, webhook), its
// PostgreSQL cluster when it crashes one, its ports and its directory. Two
// at a time (go test's -parallel: the CPUs of CI's 2-core machine), the
// package waits on their fixed durations half as long.
func runChaosCommand(t *testing.T, bins Binaries, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins.Outbox, append([]string{"chaos", "--orders-bin", bins.Orders,
		"--database-url", outboxtest.DatabaseURL()}, args...)...)
	cmd.Env = environ("", 0)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("outbox chaos %s (%s):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), out)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("outbox chaos: %v", err)
		return "", -1
	}
}

// figure returns the number on the report line starting with name.
func figure(t *testing.T, out, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the report has no %q line", name)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestChaosRun is the CI's short chaos run: 30 s of faults on the normal
// build, which must report zero violations. Seed 20261201's 30 s schedule
// has every kind of fault: 6 failpoints (relay, consumers and API, most on
// their n-th hit, so that they fire whatever the machine's pace), 6 kills,
// a broker restart and a relay paused. Until 7 December 2026, when CI went
// over its 15 minutes, it ran a minute of seed 20261130 (5 failpoints).
func TestChaosRun(t *testing.T) {
	t.Parallel() // see runChaosCommand
	out, code := runChaosCommand(t, testBinaries(t), "--duration", "30s", "--seed", "20261201")
	if code != 0 {
		t.Fatalf("outbox chaos exited with %d", code)
	}
	for _, inv := range Invariants {
		if n := figure(t, out, "violations "+inv); n != 0 {
			t.Errorf("%d violations of %s", n, inv)
		}
	}
	for _, f := range []string{"commits", "processes killed", "broker restarts", "failpoints fired", "events"} {
		if figure(t, out, f) == 0 {
			t.Errorf("the run had no %s", f)
		}
	}
	if !strings.Contains(out, "seed 20261201: all invariants hold") {
		t.Error("the report does not end with its seed and the verdict")
	}
}

// TestChaosRunCDC is a short chaos run with --mode cdc: the relays stream a
// logical replication slot of a private cluster (one at a time; a killed
// one's slot is taken over), with the CDC stream's boundaries among the
// failpoints (seed 11 arms cdc/before-confirm and cdc/before-publish),
// PostgreSQL crashed and restarted under everything, and the slot
// invalidated by PostgreSQL (the gap published by the safety net); no
// invariant may be violated.
func TestChaosRunCDC(t *testing.T) {
	t.Parallel() // see runChaosCommand
	out, code := runChaosCommand(t, testBinaries(t), "--mode", "cdc", "--duration", "30s", "--seed", "11", "--recover-timeout", "90s")
	if code != 0 {
		t.Fatalf("outbox chaos --mode cdc exited with %d", code)
	}
	for _, inv := range Invariants {
		if n := figure(t, out, "violations "+inv); n != 0 {
			t.Errorf("%d violations of %s", n, inv)
		}
	}
	if figure(t, out, "postgres restarts") == 0 {
		t.Error("the run did not crash PostgreSQL")
	}
	if figure(t, out, "slot invalidations") == 0 {
		t.Error("no relay found the slot invalidated and recreated it")
	}
	if n := figure(t, out, "cdc streams"); n < 2 {
		t.Errorf("the slot was streamed %d times; the relays' kills should have made another relay stream it", n)
	}
	if figure(t, out, "processes killed") == 0 || figure(t, out, "events") == 0 {
		t.Error("the run killed nothing or published nothing")
	}
	if !strings.Contains(out, "relays in cdc mode") || !strings.Contains(out, "seed 11: all invariants hold") {
		t.Error("the report does not say the relays ran in cdc mode, or does not end with the verdict")
	}
}

// TestChaosRunKafka is a short chaos run with --destination kafka: the
// relays publish to, and the consumers' group reads from, franz-go's
// in-process Kafka-protocol cluster (kfake) that the chaos process runs,
// persisted to the run's directory, so that the broker restarts apply as on
// NATS; no invariant may be violated.
func TestChaosRunKafka(t *testing.T) {
	// Not parallel: under load its seed's failpoints, on their first hits,
	// did not fire (the run fails "no failpoints fired").
	out, code := runChaosCommand(t, testBinaries(t), "--duration", "20s", "--seed", "12", "--destination", "kafka", "--recover-timeout", "60s")
	if code != 0 {
		t.Fatalf("outbox chaos exited with %d", code)
	}
	for _, inv := range Invariants {
		if n := figure(t, out, "violations "+inv); n != 0 {
			t.Errorf("%d violations of %s", n, inv)
		}
	}
	for _, f := range []string{"commits", "processes killed", "failpoints fired", "broker restarts", "events"} {
		if figure(t, out, f) == 0 {
			t.Errorf("the run had no %s", f)
		}
	}
	if !regexp.MustCompile(`destination: in-process Kafka \(franz-go kfake, persisted to disk\) at 127\.0\.0\.1:\d+, topic chaos_12_[0-9a-f]+\.order`).MatchString(out) {
		t.Error("the run does not say it runs on kfake, with its topic")
	}
	if !strings.Contains(out, "seed 12: all invariants hold") {
		t.Error("the report does not end with its seed and the verdict")
	}
}

// TestChaosRunWebhook is a short chaos run with --destination webhook: the
// relays POST to the one inventory consumer, which is the endpoint, with a
// secret of the run's own; the consumer is killed and restarted by the
// schedule, there are no broker faults, every invariant holds and the
// secret is printed nowhere, the processes' logs included.
func TestChaosRunWebhook(t *testing.T) {
	t.Parallel() // see runChaosCommand
	out, code := runChaosCommand(t, testBinaries(t), "--duration", "15s", "--seed", "13", "--destination", "webhook", "--recover-timeout", "60s", "--verbose")
	if code != 0 {
		t.Fatalf("outbox chaos exited with %d", code)
	}
	for _, inv := range Invariants {
		if n := figure(t, out, "violations "+inv); n != 0 {
			t.Errorf("%d violations of %s", n, inv)
		}
	}
	for _, f := range []string{"commits", "processes killed", "events", "stream messages"} {
		if figure(t, out, f) == 0 {
			t.Errorf("the run had no %s", f)
		}
	}
	if !regexp.MustCompile(`destination: webhook: the relays POST to the inventory consumer's HTTP server at http://127\.0\.0\.1:\d+/events`).MatchString(out) {
		t.Error("the run does not say the relays post to the consumer")
	}
	if !strings.Contains(out, "processes: api, consumer-1, relay-1, relay-2 ") || !strings.Contains(out, "1 consumer process instead of 2: a webhook has one endpoint") {
		t.Error("the run does not say it runs one consumer process")
	}
	if figure(t, out, "broker restarts") != 0 || !strings.Contains(out, "no broker restarts: not applicable to a webhook") {
		t.Error("the run does not say broker restarts do not apply")
	}
	if strings.Contains(out, "whsec_") || strings.Contains(out, "OUTBOX_WEBHOOK_SECRET=") {
		t.Error("the signing secret was printed")
	}
	if !strings.Contains(out, "seed 13: all invariants hold") {
		t.Error("the report does not end with its seed and the verdict")
	}
}

// TestChaosCatchesBrokenBuild builds the relay with a deliberate bug
// (-tags outbox_brokenmark: events marked published before the broker's
// ack) and shows that a short chaos run reports the events it lost and
// exits non-zero. The normal build's run is TestChaosRun.
func TestChaosCatchesBrokenBuild(t *testing.T) {
	t.Parallel() // see runChaosCommand
	out, code := runChaosCommand(t, testBinaries(t, "outbox_brokenmark"), "--duration", "20s", "--seed", "5", "--recover-timeout", "10s")
	if m := regexp.MustCompile(`logs kept in (\S+)`).FindStringSubmatch(out); m != nil {
		t.Cleanup(func() { _ = os.RemoveAll(m[1]) })
	}
	if code == 0 {
		t.Fatal("the chaos run of the broken build passed")
	}
	if n := figure(t, out, "violations I3"); n == 0 {
		t.Fatal("the broken build lost no event the checker saw (I3)")
	}
	if !strings.Contains(out, "seed 5: FAILED") {
		t.Error("the report does not say the run failed")
	}
}

// TestScheduleReplays: a seed gives one schedule, another seed another.
func TestScheduleReplays(t *testing.T) {
	t.Parallel()
	members := NewSystem(SystemConfig{Relays: 2, Consumers: 2}).Names()
	cfg := ScheduleConfig{Seed: 42, Duration: time.Minute, Members: members}
	a, b := NewSchedule(cfg), NewSchedule(cfg)
	if a.String() != b.String() || a.Digest() != b.Digest() {
		t.Fatal("the same seed gave two schedules")
	}
	cfg.Seed = 43
	if c := NewSchedule(cfg); c.Digest() == a.Digest() {
		t.Fatal("two seeds gave the same schedule")
	}
	if a.Count(FaultBroker) == 0 || a.Count(FaultPause) == 0 || a.Count(FaultKill) == 0 || a.Count(FaultFailpoint) == 0 {
		t.Fatalf("a minute's schedule lacks a kind of fault:\n%s", a)
	}
	for _, f := range a {
		if f.At < 2*time.Second || f.At > 57*time.Second {
			t.Fatalf("fault outside the fault window: %s", f)
		}
	}
	// Without broker restarts (a destination that cannot be restarted):
	// the same seed's other faults, none on the broker.
	cfg.Seed, cfg.NoBroker = 42, true
	var others Schedule
	for _, f := range a {
		if f.Kind != FaultBroker {
			others = append(others, f)
		}
	}
	if nb := NewSchedule(cfg); nb.Count(FaultBroker) != 0 || nb.String() != others.String() {
		t.Fatalf("NoBroker schedule:\n%s\nwant the seed's faults without the broker restarts:\n%s", nb, others)
	}
	// With PostgreSQL crashes and slot invalidations (a CDC run on a
	// cluster of its own): the seed's other faults, plus those.
	cfg.NoBroker, cfg.Postgres = false, true
	pg := NewSchedule(cfg)
	var rest Schedule
	for _, f := range pg {
		if f.Kind != FaultPostgres && f.Kind != FaultSlot {
			rest = append(rest, f)
		}
	}
	if pg.Count(FaultPostgres) == 0 || pg.Count(FaultSlot) == 0 || rest.String() != a.String() {
		t.Fatalf("Postgres schedule:\n%s\nwant the seed's faults plus PostgreSQL crashes and slot invalidations:\n%s", pg, a)
	}
}
