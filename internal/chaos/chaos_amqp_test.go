package chaos

import (
	"regexp"
	"strings"
	"testing"
)

// TestChaosRunAMQP is a short chaos run with --destination amqp: the relays
// publish to, and the consumers share a queue on, a RabbitMQ node that the
// chaos run starts on free ports and restarts as a broker fault (the seed's
// schedule has one); the checker reads the events from the witness queue.
// No invariant may be violated.
func TestChaosRunAMQP(t *testing.T) {
	// Not parallel, unlike the other runs: its RabbitMQ node (Erlang) takes
	// the longest to start, and beside two runs on a loaded machine it did
	// not answer within the run's minute.
	out, code := runChaosCommand(t, testBinaries(t), "--duration", "20s", "--seed", "12", "--destination", "amqp", "--recover-timeout", "60s")
	if code != 0 {
		t.Fatalf("outbox chaos exited with %d", code)
	}
	for _, inv := range Invariants {
		if n := figure(t, out, "violations "+inv); n != 0 {
			t.Errorf("%d violations of %s", n, inv)
		}
	}
	for _, f := range []string{"commits", "processes killed", "broker restarts", "events", "stream messages"} {
		if figure(t, out, f) == 0 {
			t.Errorf("the run had no %s", f)
		}
	}
	if !regexp.MustCompile(`destination: RabbitMQ node of the run's own at amqp://guest:xxxxx@127\.0\.0\.1:\d+/, exchange chaos_12_[0-9a-f]+, queue chaos_12_[0-9a-f]+\.inventory \(witness chaos_12_[0-9a-f]+\.witness\)`).MatchString(out) {
		t.Error("the run does not say it runs on a RabbitMQ node of its own, with its exchange and queues")
	}
	if !strings.Contains(out, "seed 12: all invariants hold") {
		t.Error("the report does not end with its seed and the verdict")
	}
}
