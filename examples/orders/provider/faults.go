package provider

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FaultKind names an injectable fault.
type FaultKind string

// The faults. All but FaultLatency end the request; of those, the first
// rule that fires wins.
const (
	// FaultLatency delays the request (Latency plus up to Jitter) before it
	// executes, while its Idempotency-Key is in flight.
	FaultLatency FaultKind = "latency"
	// FaultErrorBeforeCommit answers 500 after the work was done and rolled
	// back: nothing happened, but the caller cannot know that.
	FaultErrorBeforeCommit FaultKind = "error-before-commit"
	// FaultErrorAfterCommit answers 500 although the charge committed.
	FaultErrorAfterCommit FaultKind = "error-after-commit"
	// FaultTimeoutAfterCommit commits, then answers nothing until the
	// caller gives up (or Hang passes) and closes the connection.
	FaultTimeoutAfterCommit FaultKind = "timeout-after-commit"
	// FaultDropResponse commits, then resets the connection without a
	// response.
	FaultDropResponse FaultKind = "drop-response"
	// FaultCrash commits, then kills the provider process (SIGKILL) before
	// it responds.
	FaultCrash FaultKind = "crash"
)

var faultKinds = []FaultKind{FaultLatency, FaultErrorBeforeCommit, FaultErrorAfterCommit, FaultTimeoutAfterCommit, FaultDropResponse, FaultCrash}

// HangDefault is how long a timeout-after-commit waits for the caller to
// give up before closing the connection.
const HangDefault = time.Minute

// Duration is a time.Duration written as text ("150ms") in JSON.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"150ms\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Rule is one injected fault and when it fires. Only requests that passed
// validation count. A rule fires on a matching request when it has skipped
// After of them, has fired fewer than Next times (0: no bound), and a draw
// falls under Probability.
type Rule struct {
	Fault FaultKind `json:"fault"`
	// On is "charges" or "refunds"; empty matches both.
	On string `json:"on,omitempty"`
	// Probability of firing, in (0, 1]; 0 means 1 (always).
	Probability float64 `json:"probability,omitempty"`
	// After skips the first After matching requests ("crash on the 3rd":
	// After 2, Next 1).
	After int `json:"after,omitempty"`
	// Next bounds how many times the rule fires; 0 is no bound.
	Next int `json:"next,omitempty"`
	// Latency and Jitter: FaultLatency waits Latency plus a uniform draw
	// in [0, Jitter).
	Latency Duration `json:"latency,omitempty"`
	Jitter  Duration `json:"jitter,omitempty"`
	// Hang: FaultTimeoutAfterCommit's longest wait. Defaults to HangDefault.
	Hang Duration `json:"hang,omitempty"`
}

// String writes the rule in the --fault flag's syntax.
func (r Rule) String() string {
	var opts []string
	if r.On != "" {
		opts = append(opts, "on="+r.On)
	}
	if r.Probability != 0 {
		opts = append(opts, "p="+strconv.FormatFloat(r.Probability, 'g', -1, 64))
	}
	if r.After != 0 {
		opts = append(opts, "after="+strconv.Itoa(r.After))
	}
	if r.Next != 0 {
		opts = append(opts, "next="+strconv.Itoa(r.Next))
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"latency", r.Latency}, {"jitter", r.Jitter}, {"hang", r.Hang}} {
		if d.v != 0 {
			opts = append(opts, d.name+"="+time.Duration(d.v).String())
		}
	}
	if len(opts) == 0 {
		return string(r.Fault)
	}
	return string(r.Fault) + ":" + strings.Join(opts, ",")
}

// Validate checks the rule.
func (r Rule) Validate() error {
	known := false
	for _, k := range faultKinds {
		known = known || r.Fault == k
	}
	switch {
	case !known:
		return fmt.Errorf("unknown fault %q (want one of %v)", r.Fault, faultKinds)
	case r.On != "" && r.On != "charges" && r.On != "refunds":
		return fmt.Errorf("fault %s: on must be charges or refunds, not %q", r.Fault, r.On)
	case r.Probability < 0 || r.Probability > 1:
		return fmt.Errorf("fault %s: probability %g is not in [0, 1]", r.Fault, r.Probability)
	case r.After < 0 || r.Next < 0:
		return fmt.Errorf("fault %s: after and next must not be negative", r.Fault)
	case r.Latency < 0 || r.Jitter < 0 || r.Hang < 0:
		return fmt.Errorf("fault %s: durations must not be negative", r.Fault)
	case r.Fault == FaultLatency && r.Latency == 0 && r.Jitter == 0:
		return fmt.Errorf("fault latency needs latency or jitter")
	}
	return nil
}

// ParseRule reads a rule in the --fault flag's syntax:
// KIND[:key=value,...] with keys on, p, after, next, latency, jitter, hang;
// e.g. "timeout-after-commit:p=0.1" or "crash:after=2,next=1".
func ParseRule(s string) (Rule, error) {
	kind, opts, _ := strings.Cut(strings.TrimSpace(s), ":")
	r := Rule{Fault: FaultKind(kind)}
	for opt := range strings.SplitSeq(opts, ",") {
		if opt == "" {
			continue
		}
		k, v, ok := strings.Cut(opt, "=")
		if !ok {
			return Rule{}, fmt.Errorf("fault %q: option %q is not key=value", s, opt)
		}
		var err error
		switch k {
		case "on":
			r.On = v
		case "p":
			r.Probability, err = strconv.ParseFloat(v, 64)
		case "after":
			r.After, err = strconv.Atoi(v)
		case "next":
			r.Next, err = strconv.Atoi(v)
		case "latency":
			r.Latency, err = parseDuration(v)
		case "jitter":
			r.Jitter, err = parseDuration(v)
		case "hang":
			r.Hang, err = parseDuration(v)
		default:
			return Rule{}, fmt.Errorf("fault %q: unknown option %q (want on, p, after, next, latency, jitter, hang)", s, k)
		}
		if err != nil {
			return Rule{}, fmt.Errorf("fault %q: option %s: %v", s, k, err)
		}
	}
	return r, r.Validate()
}

func parseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(s)
	return Duration(d), err
}

// Faults is the set of rules in force and the seed of their draws.
type Faults struct {
	// Seed makes the draws reproducible; 0 picks a random seed, reported
	// in FaultStatus.
	Seed  uint64 `json:"seed,omitempty"`
	Rules []Rule `json:"rules"`
}

// RuleStatus is a rule with its counters.
type RuleStatus struct {
	Rule
	// Matched counts the requests the rule was asked about; Fired those it
	// fired on.
	Matched int64 `json:"matched"`
	Fired   int64 `json:"fired"`
}

// FaultStatus is the body of GET /control/faults.
type FaultStatus struct {
	Seed  uint64       `json:"seed"`
	Rules []RuleStatus `json:"rules"`
	// Injected counts the faults injected by kind since the rules were set.
	Injected map[FaultKind]int64 `json:"injected"`
	// InFlight counts the Idempotency-Keys being executed now.
	InFlight int `json:"in_flight"`
}

// decision is the faults drawn for one request.
type decision struct {
	latency time.Duration
	fault   FaultKind // "" or a terminal fault
	hang    time.Duration
}

// injector draws faults for requests from the rules in force.
type injector struct {
	mu       sync.Mutex
	seed     uint64
	rules    []RuleStatus
	rng      *rand.Rand
	injected map[FaultKind]int64
}

func (in *injector) set(f Faults) error {
	for _, r := range f.Rules {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	seed := f.Seed
	for seed == 0 {
		seed = rand.Uint64()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.seed = seed
	in.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	in.rules = make([]RuleStatus, len(f.Rules))
	for i, r := range f.Rules {
		in.rules[i] = RuleStatus{Rule: r}
	}
	in.injected = map[FaultKind]int64{}
	return nil
}

func (in *injector) status() FaultStatus {
	in.mu.Lock()
	defer in.mu.Unlock()
	st := FaultStatus{Seed: in.seed, Rules: append([]RuleStatus{}, in.rules...), Injected: map[FaultKind]int64{}}
	for k, v := range in.injected {
		st.Injected[k] = v
	}
	return st
}

// fires asks rule r about one request.
func (in *injector) fires(r *RuleStatus) bool {
	r.Matched++
	if r.Matched <= int64(r.After) || (r.Next > 0 && r.Fired >= int64(r.Next)) {
		return false
	}
	if r.Probability != 0 && r.Probability < 1 && in.rng.Float64() >= r.Probability {
		return false
	}
	r.Fired++
	in.injected[r.Fault]++
	return true
}

// decide draws the faults of one request to endpoint ("charges" or
// "refunds"). Latency rules all apply; terminal rules are asked in order
// until one fires, so a rule behind one that fired keeps its turn.
func (in *injector) decide(endpoint string) decision {
	in.mu.Lock()
	defer in.mu.Unlock()
	var d decision
	for i := range in.rules {
		r := &in.rules[i]
		if r.On != "" && r.On != endpoint {
			continue
		}
		if r.Fault == FaultLatency {
			if in.fires(r) {
				d.latency += time.Duration(r.Latency)
				if r.Jitter > 0 {
					d.latency += time.Duration(in.rng.Int64N(int64(r.Jitter)))
				}
			}
			continue
		}
		if d.fault == "" && in.fires(r) {
			d.fault = r.Fault
			d.hang = time.Duration(r.Hang)
			if d.hang == 0 {
				d.hang = HangDefault
			}
		}
	}
	return d
}
