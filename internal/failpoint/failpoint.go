// Package failpoint injects faults at named boundaries of outbox's processes,
// driven by the OUTBOX_FAILPOINTS environment variable.
//
// The variable holds semicolon-separated rules, each "name=action[@n|%p]":
//
//	relay/after-ack-before-mark=crash          SIGKILL this process on the first hit
//	relay/before-publish=error@3               return an error on the 3rd hit only
//	order/before-commit=sleep(250ms)%0.5       sleep on half the hits (seeded)
//
// Actions: crash (SIGKILL the own process, so no deferred clean-up runs),
// error (Hit returns an error), sleep(D). "@n" fires on the n-th hit only;
// "%p" fires with probability p, drawn from a generator seeded by
// OUTBOX_FAILPOINTS_SEED (default 1), so a run can be replayed. When the
// variable is empty, Hit is a single atomic load (BenchmarkHitDisabled).
//
// Rules read from the environment report every firing on stderr, one line
// "failpoint <name>: <action> (pid N)", so that a supervisor such as
// "outbox chaos" can count what fired in the processes it runs. A crash is
// always reported, before the signal.
//
// The boundaries named in the code are
//
//	order/before-commit                  order API, before a command's COMMIT
//	order/after-commit-before-response   order API, after COMMIT, before the HTTP response
//	relay/during-claim                   relay, inside the claim transaction, before its COMMIT
//	relay/after-claim                    relay, after the claim committed
//	relay/before-publish                 relay, before each publish wave
//	relay/after-ack-before-mark          relay, after the broker's acks, before published_at is set
//	consumer/after-commit-before-ack     inventory consumer, after its inbox transaction, before the ack
//	cleanup/mid-batch                    clean-up, inside each batch: after its DELETE, before its COMMIT
//	sideeffect/before-call               sideeffect.Caller.Do, after the attempt was claimed, before the external call
//	sideeffect/after-call-before-record  sideeffect.Caller.Do, after the external call returned, before its outcome is recorded
//
// See docs/chaos.md for the tests that crash a process at each of them.
package failpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvVar names the environment variable read at start-up.
const EnvVar = "OUTBOX_FAILPOINTS"

// SeedEnvVar names the variable holding the seed for probabilistic rules.
const SeedEnvVar = "OUTBOX_FAILPOINTS_SEED"

// ErrInjected is wrapped by the errors that "error" actions return.
var ErrInjected = errors.New("failpoint: injected error")

type action int

const (
	actCrash action = iota
	actError
	actSleep
)

type rule struct {
	name  string
	act   action
	sleep time.Duration
	nth   int64   // 0: every hit
	prob  float64 // 0: always
	hits  atomic.Int64
	fired atomic.Int64
}

var (
	enabled atomic.Bool
	report  atomic.Bool // report every firing on stderr
	mu      sync.Mutex
	rules   map[string]*rule
	rng     *rand.Rand
	crashFn = func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
)

func init() {
	if spec := os.Getenv(EnvVar); spec != "" {
		seed := uint64(1)
		if s := os.Getenv(SeedEnvVar); s != "" {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "outbox: %s=%q: not an unsigned integer\n", SeedEnvVar, s)
				os.Exit(2)
			}
			seed = v
		}
		if err := Enable(spec, seed); err != nil {
			fmt.Fprintf(os.Stderr, "outbox: %s: %v\n", EnvVar, err)
			os.Exit(2)
		}
		report.Store(true)
	}
}

// Enabled reports whether any failpoint rule is active. Code that must take a
// slower path to offer a boundary (such as an explicit transaction around a
// statement that otherwise runs alone) checks it first, so that the path
// without failpoints stays as it is.
func Enabled() bool { return enabled.Load() }

// Enable replaces the active rules with those of spec (the OUTBOX_FAILPOINTS
// syntax). An empty spec disables every failpoint.
func Enable(spec string, seed uint64) error {
	parsed := map[string]*rule{}
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r, err := parseRule(part)
		if err != nil {
			return err
		}
		parsed[r.name] = r
	}
	mu.Lock()
	rules = parsed
	rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	mu.Unlock()
	enabled.Store(len(parsed) > 0)
	return nil
}

func parseRule(s string) (*rule, error) {
	name, act, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return nil, fmt.Errorf("rule %q: want name=action", s)
	}
	r := &rule{name: name}
	if i := strings.LastIndexAny(act, "@%"); i >= 0 && !strings.Contains(act[i:], ")") {
		mod := act[i+1:]
		switch act[i] {
		case '@':
			n, err := strconv.ParseInt(mod, 10, 64)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("rule %q: @%s is not a positive hit number", s, mod)
			}
			r.nth = n
		case '%':
			p, err := strconv.ParseFloat(mod, 64)
			if err != nil || p <= 0 || p > 1 {
				return nil, fmt.Errorf("rule %q: %%%s is not a probability in (0,1]", s, mod)
			}
			r.prob = p
		}
		act = act[:i]
	}
	switch {
	case act == "crash":
		r.act = actCrash
	case act == "error":
		r.act = actError
	case strings.HasPrefix(act, "sleep(") && strings.HasSuffix(act, ")"):
		d, err := time.ParseDuration(act[len("sleep(") : len(act)-1])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("rule %q: bad sleep duration", s)
		}
		r.act, r.sleep = actSleep, d
	default:
		return nil, fmt.Errorf("rule %q: unknown action %q (want crash, error or sleep(D))", s, act)
	}
	return r, nil
}

// Hit is called at the boundary name. It returns an error wrapping
// ErrInjected when an "error" rule fires, sleeps for "sleep", and never
// returns for "crash".
func Hit(name string) error {
	if !enabled.Load() {
		return nil
	}
	return hit(name)
}

func hit(name string) error {
	mu.Lock()
	r := rules[name]
	fire := false
	if r != nil {
		n := r.hits.Add(1)
		switch {
		case r.nth > 0:
			fire = n == r.nth
		case r.prob > 0:
			fire = rng.Float64() < r.prob
		default:
			fire = true
		}
	}
	mu.Unlock()
	if !fire {
		return nil
	}
	r.fired.Add(1)
	switch r.act {
	case actCrash:
		fmt.Fprintf(os.Stderr, "failpoint %s: crash (SIGKILL pid %d)\n", name, os.Getpid())
		crashFn()
	case actSleep:
		if report.Load() {
			fmt.Fprintf(os.Stderr, "failpoint %s: sleep %s (pid %d)\n", name, r.sleep, os.Getpid())
		}
		time.Sleep(r.sleep)
		return nil
	}
	if report.Load() {
		fmt.Fprintf(os.Stderr, "failpoint %s: error (pid %d)\n", name, os.Getpid())
	}
	return fmt.Errorf("%w at %s", ErrInjected, name)
}

// Fired reports how many times the rule for name has fired.
func Fired(name string) int64 {
	mu.Lock()
	defer mu.Unlock()
	if r := rules[name]; r != nil {
		return r.fired.Load()
	}
	return 0
}
