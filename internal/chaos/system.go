package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgoutbox/outbox/internal/failpoint"
)

// Roles of the system's processes.
const (
	RoleAPI      = "api"      // orders api
	RoleRelay    = "relay"    // outbox relay
	RoleConsumer = "consumer" // orders inventory
)

// SystemConfig describes the order system run as processes.
type SystemConfig struct {
	Bins        Binaries
	DatabaseURL string
	Schema      string
	// Destination is where the relays publish and the consumers read: its
	// URL and Args make their destination flags.
	Destination Destination
	// APIPort is the order API's port, kept across restarts.
	APIPort int
	// Relays and Consumers are how many of each run. Default to 1.
	Relays, Consumers int
	// Lease is the relays' lease. Defaults to 2s.
	Lease time.Duration
	// AckWait is the consumers' ack wait. Defaults to 2s.
	AckWait time.Duration
	// Sink receives every process's output lines.
	Sink Sink
	// RelayArgs are extra flags of the relays (e.g. --mode cdc).
	RelayArgs []string
	// Saga adds the order saga's processes (system_saga.go): the payment
	// provider in ProviderMode on ProviderPort (its control listener on
	// ProviderControlPort), the payments consumer and the saga consumer;
	// the inventory consumers record their saga events.
	Saga                              bool
	ProviderMode                      string
	ProviderPort, ProviderControlPort int
}

// Exit records how one incarnation of a member ended.
type Exit struct {
	Member      string
	Incarnation int
	Failpoints  string // the OUTBOX_FAILPOINTS it ran with
	Signal      syscall.Signal
	Err         error
	// ByHarness is true when the harness stopped or killed it.
	ByHarness bool
	// Failpoint is the crash failpoint it reported, if any.
	Failpoint string
}

// System runs the order system's processes: one order API, relays and
// inventory consumers, each a member with a stable name ("api", "relay-1",
// "consumer-2", ...) that can be killed, paused and restarted, with or
// without failpoints.
type System struct {
	cfg SystemConfig

	mu      sync.Mutex
	members map[string]*member
	exits   []Exit
	history []*Process // every incarnation started
}

type member struct {
	name, role  string
	proc        *Process
	incarnation int
	failpoints  string
	byHarness   bool // the current incarnation is being stopped by the harness
	paused      bool
}

// NewSystem returns a system with its members defined, none started.
func NewSystem(cfg SystemConfig) *System {
	if cfg.Relays <= 0 {
		cfg.Relays = 1
	}
	if cfg.Consumers <= 0 {
		cfg.Consumers = 1
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 2 * time.Second
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 2 * time.Second
	}
	s := &System{cfg: cfg, members: map[string]*member{}}
	s.members["api"] = &member{name: "api", role: RoleAPI}
	for i := 1; i <= cfg.Relays; i++ {
		n := fmt.Sprintf("relay-%d", i)
		s.members[n] = &member{name: n, role: RoleRelay}
	}
	for i := 1; i <= cfg.Consumers; i++ {
		n := fmt.Sprintf("consumer-%d", i)
		s.members[n] = &member{name: n, role: RoleConsumer}
	}
	if cfg.Saga {
		for _, m := range sagaMembers {
			s.members[m[0]] = &member{name: m[0], role: m[1]}
		}
	}
	return s
}

// Config returns the system's configuration (with defaults applied).
func (s *System) Config() SystemConfig { return s.cfg }

// Names returns the members' names, sorted.
func (s *System) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.members))
	for n := range s.members {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Role returns the role of the member name.
func (s *System) Role(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.members[name]; m != nil {
		return m.role
	}
	return ""
}

// APIURL is the order API's base URL.
func (s *System) APIURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.cfg.APIPort) }

// spec returns the member's command line.
func (s *System) spec(m *member) ProcessSpec {
	c := s.cfg
	// The database URL goes in the environment (Start), not on the
	// command line, where ps would show its password to every user.
	db := []string{"--schema", c.Schema}
	dest := func(role string) []string {
		return append([]string{"--destination", c.Destination.URL()}, c.Destination.Args(role)...)
	}
	name := fmt.Sprintf("%s#%d", m.name, m.incarnation)
	switch m.role {
	case RoleAPI:
		return ProcessSpec{Name: name, Path: c.Bins.Orders,
			Args: append([]string{"api", "--listen", "127.0.0.1:" + strconv.Itoa(c.APIPort), "--shutdown-timeout", "5s"}, db...)}
	case RolePayments, RoleSaga, RoleProvider:
		return s.sagaSpec(m, name)
	case RoleRelay:
		args := append([]string{"relay", "--id", fmt.Sprintf("%s.%d", m.name, m.incarnation),
			"--lease", c.Lease.String(), "--poll-interval", "100ms", "--retry-min", "100ms", "--retry-max", "2s",
			"--shutdown-timeout", "2s", "--batch-size", "50"}, db...)
		args = append(args, c.RelayArgs...)
		return ProcessSpec{Name: name, Path: c.Bins.Outbox, Args: append(args, dest(RoleRelay)...)}
	default:
		args := append([]string{"inventory", "--ack-wait", c.AckWait.String(), "--workers", "2"}, db...)
		if c.Saga {
			args = append(args, "--saga-events")
		}
		return ProcessSpec{Name: name, Path: c.Bins.Orders, Args: append(args, dest(RoleConsumer)...)}
	}
}

// environ is the parent's environment without the variables the harness
// sets itself.
func environ(failpoints string, seed uint64) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case failpoint.EnvVar, failpoint.SeedEnvVar, "DATABASE_URL", "OUTBOX_SCHEMA", "OUTBOX_DESTINATION",
			"OUTBOX_NATS_STREAM", "OUTBOX_NATS_SUBJECT_PREFIX", "OUTBOX_RELAY_ID":
			continue
		}
		if slices.Contains(DestinationEnvNames, k) {
			continue
		}
		env = append(env, kv)
	}
	if failpoints != "" {
		env = append(env, failpoint.EnvVar+"="+failpoints, failpoint.SeedEnvVar+"="+strconv.FormatUint(seed, 10))
	}
	return env
}

// Start starts member name with the given failpoints ("" for none) and
// failpoint seed. A member that is still running is killed first.
func (s *System) Start(name, failpoints string, seed uint64) error {
	s.mu.Lock()
	m := s.members[name]
	s.mu.Unlock()
	if m == nil {
		return fmt.Errorf("no member %q", name)
	}
	s.kill(m, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	m.incarnation++
	m.failpoints = failpoints
	m.byHarness, m.paused = false, false
	spec := s.spec(m)
	spec.Env = append(environ(failpoints, seed), DestinationEnv(s.cfg.Destination, m.role)...)
	spec.Env = append(spec.Env, "DATABASE_URL="+s.cfg.DatabaseURL, "PGAPPNAME="+s.AppName(name))
	p, err := StartProcess(spec, s.cfg.Sink)
	if err != nil {
		return err
	}
	m.proc = p
	s.history = append(s.history, p)
	inc := m.incarnation
	go func() {
		<-p.Done()
		s.recordExit(m, p, inc)
	}()
	return nil
}

// AppName is the application_name member name's database sessions carry
// (PGAPPNAME; a process that sets its own, as outbox relay does, keeps it):
// the run's schema and the member, so that the harness can find, among the
// sessions of a database other tests share, the API's transactions
// (WaitWritesEnded).
func (s *System) AppName(name string) string { return "chaos " + s.cfg.Schema + " " + name }

func (s *System) recordExit(m *member, p *Process, inc int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := Exit{Member: m.name, Incarnation: inc, Failpoints: m.failpoints, Signal: p.Signaled(), Err: p.Err(), ByHarness: m.byHarness}
	for _, l := range p.Lines() {
		if fp, ok := strings.CutPrefix(l, "failpoint "); ok && strings.Contains(fp, ": crash") {
			e.Failpoint, _, _ = strings.Cut(fp, ":")
		}
	}
	s.exits = append(s.exits, e)
}

// kill SIGKILLs m's current incarnation (if running) and waits for it.
func (s *System) kill(m *member, byHarness bool) bool {
	s.mu.Lock()
	p := m.proc
	if p == nil || p.Exited() {
		s.mu.Unlock()
		return false
	}
	m.byHarness = byHarness
	s.mu.Unlock()
	p.Kill()
	return true
}

// Kill SIGKILLs member name and waits until it is gone. It reports whether
// it was running.
func (s *System) Kill(name string) bool {
	s.mu.Lock()
	m := s.members[name]
	s.mu.Unlock()
	if m == nil {
		return false
	}
	return s.kill(m, true)
}

// Stop stops member name with SIGTERM (SIGKILL after timeout) and returns
// its exit error.
func (s *System) Stop(name string, timeout time.Duration) error {
	s.mu.Lock()
	m := s.members[name]
	if m == nil || m.proc == nil || m.proc.Exited() {
		s.mu.Unlock()
		return nil
	}
	m.byHarness = true
	p := m.proc
	s.mu.Unlock()
	return p.Stop(timeout)
}

// Pause stops member name with SIGSTOP; Resume continues it.
func (s *System) Pause(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[name]
	if m == nil || m.proc == nil || m.proc.Exited() || m.paused {
		return false
	}
	m.paused = m.proc.Signal(syscall.SIGSTOP) == nil
	return m.paused
}

// Resume sends SIGCONT to a member paused with Pause.
func (s *System) Resume(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.members[name]; m != nil && m.paused && m.proc != nil {
		_ = m.proc.Signal(syscall.SIGCONT)
		m.paused = false
	}
}

// Process returns member name's current incarnation (nil before Start).
func (s *System) Process(name string) *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.members[name]; m != nil {
		return m.proc
	}
	return nil
}

// State describes a member: running, its incarnation, its failpoints and
// whether it is paused.
func (s *System) State(name string) (running bool, incarnation int, failpoints string, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[name]
	if m == nil {
		return false, 0, "", false
	}
	return m.proc != nil && !m.proc.Exited(), m.incarnation, m.failpoints, m.paused
}

// History returns every incarnation started so far of the members whose
// name starts with prefix.
func (s *System) History(prefix string) []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Process
	for _, p := range s.history {
		if strings.HasPrefix(p.Name(), prefix) {
			out = append(out, p)
		}
	}
	return out
}

// Exits returns how the members' incarnations ended so far.
func (s *System) Exits() []Exit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Exit(nil), s.exits...)
}

// StopAll stops every member: SIGTERM, then SIGKILL after timeout. It
// returns the members that did not exit cleanly.
func (s *System) StopAll(timeout time.Duration) []string {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for _, n := range s.Names() {
		wg.Go(func() {
			if err := s.Stop(n, timeout); err != nil {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%s: %v", n, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Strings(bad)
	return bad
}

// KillAll SIGKILLs every member (for clean-up).
func (s *System) KillAll() {
	for _, n := range s.Names() {
		s.Kill(n)
	}
}

// WaitAPI waits until the order API answers GET /healthz.
func (s *System) WaitAPI(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	for {
		resp, err := client.Get(s.APIURL() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("order API not healthy at %s: %w (last error %v)", s.APIURL(), ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
