package chaos

import (
	"strings"
	"testing"
)

// TestChaosRunSaga is the CI's short chaos run of the order saga, provider
// in mode idempotent: the payments, saga and provider processes are killed,
// payments between the provider call and its record, and the provider times
// out or drops its responses after committing; I6 (no order charged twice)
// and I7 (every order settled) must hold with the rest.
func TestChaosRunSaga(t *testing.T) {
	t.Parallel() // see runChaosCommand
	out, code := runChaosCommand(t, testBinaries(t), "--saga", "--duration", "40s", "--seed", "20261202", "--recover-timeout", "90s")
	if code != 0 {
		t.Fatalf("outbox chaos exited with %d", code)
	}
	for _, inv := range append([]string{"I6", "I7"}, Invariants...) {
		if n := figure(t, out, "violations "+inv); n != 0 {
			t.Errorf("%d violations of %s", n, inv)
		}
	}
	for _, f := range []string{"saga orders", "provider charges", "provider refunds", "provider faults", "ambiguous calls", "processes killed"} {
		if figure(t, out, f) == 0 {
			t.Errorf("the run had no %s", f)
		}
	}
	if !strings.Contains(out, "seed 20261202: all invariants hold") {
		t.Error("the report does not end with its seed and the verdict")
	}
}
