package provider

import (
	"slices"
	"testing"
	"time"
)

// TestParseRule: the flag syntax round-trips through String, and bad rules
// are refused.
func TestParseRule(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"crash:after=2,next=1",
		"timeout-after-commit:p=0.25,hang=5s",
		"latency:on=charges,latency=50ms,jitter=20ms",
		"drop-response",
		"error-before-commit:on=refunds,next=3",
	} {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if r.String() != s {
			t.Errorf("ParseRule(%q).String() = %q", s, r.String())
		}
	}
	for _, s := range []string{"meteor", "crash:p=2", "crash:after=-1", "latency", "crash:on=ledger", "crash:p", "crash:colour=red", "latency:latency=fast"} {
		if _, err := ParseRule(s); err == nil {
			t.Errorf("ParseRule(%q) accepted", s)
		}
	}
}

// draws records which of n requests each fault fired on.
func draws(t *testing.T, f Faults, endpoint string, n int) []FaultKind {
	t.Helper()
	var in injector
	if err := in.set(f); err != nil {
		t.Fatal(err)
	}
	out := make([]FaultKind, n)
	for i := range out {
		out[i] = in.decide(endpoint).fault
	}
	return out
}

// TestFaultDraws: after/next pick exact requests, the same seed draws the
// same faults, another seed others, and "on" limits a rule to one endpoint.
func TestFaultDraws(t *testing.T) {
	t.Parallel()
	got := draws(t, Faults{Rules: []Rule{{Fault: FaultCrash, After: 2, Next: 1}}}, "charges", 5)
	if want := []FaultKind{"", "", FaultCrash, "", ""}; !slices.Equal(got, want) {
		t.Fatalf("crash:after=2,next=1 fired on %v, want %v", got, want)
	}
	random := Faults{Seed: 7, Rules: []Rule{{Fault: FaultDropResponse, Probability: 0.5}}}
	a, b := draws(t, random, "charges", 200), draws(t, random, "charges", 200)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed drew different faults")
	}
	fired := 0
	for _, k := range a {
		if k != "" {
			fired++
		}
	}
	if fired == 0 || fired == 200 {
		t.Fatalf("p=0.5 fired on %d of 200 requests", fired)
	}
	random.Seed = 8
	if slices.Equal(a, draws(t, random, "charges", 200)) {
		t.Fatal("another seed drew the same faults")
	}
	// The first terminal rule that fires wins; the next keeps its turn.
	got = draws(t, Faults{Rules: []Rule{{Fault: FaultDropResponse, Next: 1}, {Fault: FaultErrorAfterCommit, Next: 1}}}, "charges", 3)
	if want := []FaultKind{FaultDropResponse, FaultErrorAfterCommit, ""}; !slices.Equal(got, want) {
		t.Fatalf("two next=1 rules fired on %v, want %v", got, want)
	}
	if got := draws(t, Faults{Rules: []Rule{{Fault: FaultCrash, On: "refunds"}}}, "charges", 3); !slices.Equal(got, []FaultKind{"", "", ""}) {
		t.Fatalf("a refunds rule fired on charges: %v", got)
	}
	var in injector
	_ = in.set(Faults{Rules: []Rule{{Fault: FaultLatency, Latency: Duration(time.Second), Jitter: Duration(time.Second)}}})
	if d := in.decide("charges"); d.latency < time.Second || d.latency >= 2*time.Second {
		t.Fatalf("latency 1s + jitter 1s drew %v", d.latency)
	}
}
