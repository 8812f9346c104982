package chaos

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// FaultKind is a kind of fault the chaos run injects.
type FaultKind string

// Fault kinds.
const (
	// FaultKill SIGKILLs a process; the supervisor restarts it.
	FaultKill FaultKind = "kill"
	// FaultFailpoint restarts a process with a failpoint rule armed
	// (OUTBOX_FAILPOINTS) for a while; a crash rule kills it at the
	// boundary, error and sleep rules fail or stall it there.
	FaultFailpoint FaultKind = "failpoint"
	// FaultPause freezes a relay (SIGSTOP) past its lease, then lets it
	// continue (SIGCONT).
	FaultPause FaultKind = "pause"
	// FaultBroker stops the broker for a while and starts it again on the
	// same port and storage.
	FaultBroker FaultKind = "broker"
	// FaultPostgres crashes PostgreSQL (immediate shutdown: crash recovery
	// at the next start) for a while and starts it again; only in runs on a
	// cluster of their own (outbox chaos --mode cdc).
	FaultPostgres FaultKind = "postgres"
	// FaultSlot makes PostgreSQL invalidate the CDC slot: WAL segment
	// switches and a checkpoint past the cluster's tiny
	// max_slot_wal_keep_size (outbox chaos --mode cdc).
	FaultSlot FaultKind = "slot"
)

// Fault is one scheduled fault.
type Fault struct {
	// At is the time from the start of the run.
	At   time.Duration
	Kind FaultKind
	// Target is the member ("relay-2"); empty for the broker.
	Target string
	// Rule is the failpoint rule of a FaultFailpoint.
	Rule string
	// For is how long the fault lasts: the failpoint stays armed, the
	// relay paused, the broker down.
	For time.Duration
}

// String is the fault as one line of a schedule listing.
func (f Fault) String() string {
	s := fmt.Sprintf("%8s %-9s", f.At.Round(time.Millisecond), f.Kind)
	if f.Target != "" {
		s += " " + f.Target
	}
	if f.Rule != "" {
		s += " " + f.Rule
	}
	if f.For > 0 {
		s += " for " + f.For.Round(time.Millisecond).String()
	}
	return s
}

// Schedule is the faults of a run, in time order.
type Schedule []Fault

// Digest is a short hash of the schedule, printed so that two runs can be
// seen to have had the same one.
func (s Schedule) Digest() string {
	h := sha256.New()
	for _, f := range s {
		fmt.Fprintln(h, f.String())
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:12]
}

// Count returns how many faults of kind the schedule has.
func (s Schedule) Count(kind FaultKind) int {
	n := 0
	for _, f := range s {
		if f.Kind == kind {
			n++
		}
	}
	return n
}

// String lists the faults, one per line.
func (s Schedule) String() string {
	var b strings.Builder
	for _, f := range s {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// ScheduleConfig shapes a schedule.
type ScheduleConfig struct {
	Seed     uint64
	Duration time.Duration
	// Members are the processes that faults target (names as in System).
	Members []string
	// Every is the mean time between two faults. Defaults to 2s.
	Every time.Duration
	// Lease is the relays' lease: pauses last longer than it.
	Lease time.Duration
	// NoBroker leaves the broker restarts out, for a destination that
	// cannot be restarted. The other faults stay those of the seed.
	NoBroker bool
	// RelayFailpoints, when set, replaces Failpoints[RoleRelay]: the relays
	// of a CDC run also have the CDC path's boundaries (CDCRelayFailpoints).
	RelayFailpoints []string
	// Postgres adds PostgreSQL crashes and slot invalidations
	// (FaultPostgres, FaultSlot), drawn from a generator of their own so
	// that the other faults stay the seed's.
	Postgres bool
	// Saga adds provider faults (FaultProvider), drawn apart so that the
	// rest of the schedule is the same as without.
	Saga bool
}

// Failpoints lists the boundaries armed per role by the chaos run.
var Failpoints = map[string][]string{
	RoleAPI:      {"order/before-commit", "order/after-commit-before-response"},
	RoleRelay:    {"relay/during-claim", "relay/after-claim", "relay/before-publish", "relay/after-ack-before-mark"},
	RoleConsumer: {"consumer/after-commit-before-ack"},
	// Between the provider call and its record (the payments consumer is
	// killed there, or returns without recording), and before the call.
	RolePayments: {"sideeffect/after-call-before-record", "sideeffect/after-call-before-record", "sideeffect/before-call"},
}

// CDCRelayFailpoints are the boundaries armed in the relays of a run in CDC
// mode: the polling path's (the safety net, and the CDC path's claims and
// marks go through the same code) and the CDC stream's own.
var CDCRelayFailpoints = append(append([]string(nil), Failpoints[RoleRelay]...), "cdc/before-publish", "cdc/before-confirm")

// roleOf derives the role from a member's name.
func roleOf(name string) string {
	switch {
	case strings.HasPrefix(name, "relay"):
		return RoleRelay
	case strings.HasPrefix(name, "consumer"):
		return RoleConsumer
	case name == "payments":
		return RolePayments
	case name == "saga":
		return RoleSaga
	case name == "provider":
		return RoleProvider
	}
	return RoleAPI
}

// NewSchedule draws the faults of a run from cfg.Seed alone: the same seed
// and configuration give the same schedule (times, kinds, targets, rules).
// Faults start after a short warm-up and stop a few seconds before the end;
// a run of 15s or more has at least one broker restart (unless NoBroker)
// and one pause. NoBroker drops the broker restarts after drawing them, so
// the other faults are the same as with them.
func NewSchedule(cfg ScheduleConfig) Schedule {
	if cfg.Every <= 0 {
		cfg.Every = 2 * time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 2 * time.Second
	}
	members := append([]string(nil), cfg.Members...)
	sort.Strings(members)
	var relays []string
	for _, m := range members {
		if roleOf(m) == RoleRelay {
			relays = append(relays, m)
		}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7363686564756c65))
	dur := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	warmup, end := 2*time.Second, cfg.Duration-3*time.Second
	var s Schedule
	brokerFree := time.Duration(0) // the broker is back by then
	pause := func(at time.Duration) Fault {
		return Fault{At: at, Kind: FaultPause, Target: relays[rng.IntN(len(relays))], For: dur(cfg.Lease+500*time.Millisecond, 2*cfg.Lease+time.Second)}
	}
	broker := func(at time.Duration) Fault {
		f := Fault{At: at, Kind: FaultBroker, For: dur(time.Second, 4*time.Second)}
		brokerFree = at + f.For + time.Second
		return f
	}
	for at := warmup; ; {
		at += min(time.Duration(rng.ExpFloat64()*float64(cfg.Every)), 3*cfg.Every) + 50*time.Millisecond
		if at >= end {
			break
		}
		r := rng.IntN(100)
		switch {
		case r < 8 && at >= brokerFree && at+5*time.Second < end:
			s = append(s, broker(at))
		case r < 15 && len(relays) > 0:
			s = append(s, pause(at))
		case r < 45:
			target := members[rng.IntN(len(members))]
			if len(Failpoints[roleOf(target)]) == 0 {
				s = append(s, Fault{At: at, Kind: FaultKill, Target: target})
				continue
			}
			s = append(s, Fault{At: at, Kind: FaultFailpoint, Target: target, Rule: failpointRule(rng, roleOf(target), cfg.RelayFailpoints),
				For: dur(2*time.Second, 6*time.Second)})
		default:
			s = append(s, Fault{At: at, Kind: FaultKill, Target: members[rng.IntN(len(members))]})
		}
	}
	if cfg.Duration >= 15*time.Second {
		if s.Count(FaultBroker) == 0 {
			s = append(s, broker(cfg.Duration/4+dur(0, cfg.Duration/4)))
		}
		if s.Count(FaultPause) == 0 && len(relays) > 0 {
			s = append(s, pause(cfg.Duration/3+dur(0, cfg.Duration/4)))
		}
		sort.SliceStable(s, func(i, j int) bool { return s[i].At < s[j].At })
	}
	if cfg.Postgres {
		s = append(s, postgresFaults(cfg, warmup, end)...)
		sort.SliceStable(s, func(i, j int) bool { return s[i].At < s[j].At })
	}
	if cfg.Saga {
		s = append(s, providerFaults(cfg, warmup, end)...)
		sort.SliceStable(s, func(i, j int) bool { return s[i].At < s[j].At })
	}
	if cfg.NoBroker {
		kept := s[:0]
		for _, f := range s {
			if f.Kind != FaultBroker {
				kept = append(kept, f)
			}
		}
		s = kept
	}
	return s
}

// postgresFaults draws PostgreSQL crashes and slot invalidations, in turn,
// between warmup and end, about one every 12s (at least one in a run of
// 15s or more), at least 6s apart (a crash is down for 1-3s), from a
// generator of their own.
func postgresFaults(cfg ScheduleConfig, warmup, end time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x706f737467726573))
	var s Schedule
	for at := warmup + time.Duration(rng.Int64N(int64(5*time.Second))); at+5*time.Second < end; {
		f := Fault{At: at, Kind: FaultPostgres, For: time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))}
		if len(s)%2 == 1 {
			f.Kind, f.For = FaultSlot, 0
		}
		s = append(s, f)
		at += f.For + 6*time.Second + time.Duration(rng.ExpFloat64()*float64(6*time.Second))
	}
	return s
}

// failpointRule draws a rule for one of role's boundaries (relays: of
// relayNames, when set): crash, error or sleep, on the n-th hit or with a
// probability.
func failpointRule(rng *rand.Rand, role string, relayNames []string) string {
	names := Failpoints[role]
	if role == RoleRelay && relayNames != nil {
		names = relayNames
	}
	name := names[rng.IntN(len(names))]
	var action string
	switch r := rng.IntN(100); {
	case r < 55:
		action = "crash"
	case r < 85 || role != RoleRelay:
		action = "error"
	default:
		action = []string{"sleep(200ms)", "sleep(1s)", "sleep(3s)"}[rng.IntN(3)]
	}
	if rng.IntN(2) == 0 {
		return fmt.Sprintf("%s=%s@%d", name, action, 1+rng.IntN(8))
	}
	return fmt.Sprintf("%s=%s%%%s", name, action, []string{"0.05", "0.1", "0.25"}[rng.IntN(3)])
}
