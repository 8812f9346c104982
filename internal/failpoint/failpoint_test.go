package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The failpoint tests change process-wide state, so none of them is parallel.

func enable(t *testing.T, spec string, seed uint64) {
	t.Helper()
	if err := Enable(spec, seed); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Enable("", 0) })
}

func TestParseErrors(t *testing.T) {
	for _, spec := range []string{
		"nothing", "=crash", "a/b=explode", "a/b=crash@0", "a/b=crash@x", "a/b=error%0", "a/b=error%1.5",
		"a/b=sleep(forever)", "a/b=sleep(-1s)",
	} {
		if err := Enable(spec, 1); err == nil {
			t.Errorf("Enable(%q) accepted a bad rule", spec)
		}
	}
	t.Cleanup(func() { _ = Enable("", 0) })
}

func TestActions(t *testing.T) {
	enable(t, "a/error=error; a/nth=error@3 ;a/sleep=sleep(20ms)", 1)
	if !Enabled() {
		t.Fatal("Enabled() is false with rules set")
	}
	if err := Hit("a/error"); !errors.Is(err, ErrInjected) || !strings.Contains(err.Error(), "a/error") {
		t.Fatalf("error rule: %v", err)
	}
	for i := 1; i <= 5; i++ {
		err := Hit("a/nth")
		if (i == 3) != (err != nil) {
			t.Fatalf("@3 rule on hit %d: %v", i, err)
		}
	}
	start := time.Now()
	if err := Hit("a/sleep"); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("sleep rule: %v after %s", err, time.Since(start))
	}
	if err := Hit("not/armed"); err != nil {
		t.Fatalf("a name without a rule fired: %v", err)
	}
	if Fired("a/nth") != 1 || Fired("a/error") != 1 || Fired("not/armed") != 0 {
		t.Fatalf("fired counts: nth %d, error %d", Fired("a/nth"), Fired("a/error"))
	}
	_ = Enable("", 0)
	if Enabled() || Hit("a/error") != nil {
		t.Fatal("an empty spec did not disable the failpoints")
	}
}

// TestProbabilityIsSeeded: the same seed fires on the same hits.
func TestProbabilityIsSeeded(t *testing.T) {
	pattern := func(seed uint64) string {
		enable(t, "p/x=error%0.3", seed)
		var b strings.Builder
		for range 200 {
			if Hit("p/x") != nil {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	a, b, c := pattern(7), pattern(7), pattern(8)
	if a != b {
		t.Fatal("the same seed fired on different hits")
	}
	if a == c {
		t.Fatal("different seeds fired on the same hits")
	}
	if n := strings.Count(a, "x"); n < 30 || n > 90 {
		t.Fatalf("%%0.3 fired %d times in 200 hits", n)
	}
}

// TestCrashFromEnvironment runs this test binary again with a crash rule in
// OUTBOX_FAILPOINTS: the child reports the failpoint and dies of SIGKILL.
func TestCrashFromEnvironment(t *testing.T) {
	if os.Getenv("FAILPOINT_TEST_CHILD") != "" {
		_ = Hit("child/first")
		_ = Hit("child/crash")
		os.Exit(0) // not reached
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashFromEnvironment$")
	cmd.Env = append(os.Environ(), "FAILPOINT_TEST_CHILD=1", EnvVar+"=child/first=error;child/crash=crash")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL; output:\n%s", err, out)
	}
	for _, want := range []string{"failpoint child/first: error", "failpoint child/crash: crash (SIGKILL pid"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("child output lacks %q:\n%s", want, out)
		}
	}
}

// sink keeps the compiler from optimising the benchmarked calls away.
var sink error

// BenchmarkHitDisabled is the cost a failpoint adds to a hot path when
// OUTBOX_FAILPOINTS is unset: one atomic load and a predictable branch
// (well under a nanosecond; compare BenchmarkBaseline).
func BenchmarkHitDisabled(b *testing.B) {
	_ = Enable("", 0)
	for b.Loop() {
		sink = Hit("relay/after-ack-before-mark")
	}
}

// BenchmarkBaseline is the loop of BenchmarkHitDisabled without the Hit
// call, for comparison.
func BenchmarkBaseline(b *testing.B) {
	for b.Loop() {
		sink = nil
	}
}

// BenchmarkHitOtherRule is the cost when failpoints are enabled but none is
// armed at this name (a map lookup under a mutex): what a process started
// with OUTBOX_FAILPOINTS pays at its other boundaries.
func BenchmarkHitOtherRule(b *testing.B) {
	if err := Enable("some/other=error", 1); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = Enable("", 0) })
	for b.Loop() {
		sink = Hit("relay/after-ack-before-mark")
	}
}
