package outbox_test

// Side effects in the interleaving search: with a schedule's payer set, the
// consumer charges the fake payment provider (examples/orders/provider, its
// real HTTP service in this process, with its ledger) through a
// sideeffect.Caller before the inbox applies the event, keyed by the event
// id. A worker can be paused between the Caller's claim and its call, and
// the provider can commit a charge and then time out. I6: the ledger holds
// at most one charge per key.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// The side-effect caller's settings: its lease is the database's clock's
// and its own (sideeffect.Config.Clock, which the ticks move as they move
// the database's: a tick past the lease is a caller paused past its claim),
// its call timeout is real time.
const (
	ilvCallTimeout = 250 * time.Millisecond
	ilvCallLease   = 3 * time.Second
)

// ilvProvider is a worker's fake payment provider, one per mode.
type ilvProvider struct {
	pool   *pgxpool.Pool
	schema string
	svc    *provider.Service
	srv    *httptest.Server
	client *provider.Client
}

func (e *ilvEnv) provider(ctx context.Context, mode string) (*ilvProvider, error) {
	if p := e.providers[mode]; p != nil {
		return p, nil
	}
	p := &ilvProvider{schema: e.schema + "_prov_" + mode}
	var err error
	if p.pool, err = pgxpool.New(ctx, outboxtest.DatabaseURL()); err != nil {
		return nil, err
	}
	if p.svc, err = provider.New(p.pool, provider.Config{Schema: p.schema, Mode: provider.Mode(mode), Logger: discardLogger()}); err != nil {
		return nil, err
	}
	if err := p.svc.Migrate(ctx); err != nil {
		return nil, err
	}
	p.srv = httptest.NewServer(p.svc.Handler())
	p.client = provider.NewClient(p.srv.URL, "", &http.Client{})
	if e.providers == nil {
		e.providers = map[string]*ilvProvider{}
	}
	e.providers[mode] = p
	return p, nil
}

func (p *ilvProvider) reset(ctx context.Context) error {
	if err := p.svc.SetFaults(provider.Faults{}); err != nil {
		return err
	}
	_, err := p.pool.Exec(ctx, `DELETE FROM `+p.schema+`.provider_ledger; DELETE FROM `+p.schema+`.provider_refunds;
DELETE FROM `+p.schema+`.provider_charges; DELETE FROM `+p.schema+`.provider_idempotency_keys`)
	return err
}

func (p *ilvProvider) close(ctx context.Context, keep bool) {
	p.srv.Close()
	if !keep {
		_, _ = p.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+p.schema+" CASCADE")
	}
	p.pool.Close()
}

// ilvPayer is a schedule's charging consumer: the provider and the Caller.
type ilvPayer struct {
	p      *ilvProvider
	cfg    sideeffect.Config
	caller *sideeffect.Caller
}

func newIlvPayer(ctx context.Context, e *ilvEnv, mode string, clock func() time.Time) (*ilvPayer, error) {
	p, err := e.provider(ctx, mode)
	if err != nil {
		return nil, err
	}
	if err := p.reset(ctx); err != nil {
		return nil, err
	}
	cfg := sideeffect.Config{Name: "ilv.charge", Schema: e.schema, CallTimeout: ilvCallTimeout, Lease: ilvCallLease,
		CheckInterval: 10 * time.Millisecond, MaxCheckInterval: 100 * time.Millisecond, Logger: discardLogger(), Clock: clock}
	switch provider.Mode(mode) {
	case provider.ModeQueryable:
		cfg.Mode = sideeffect.Queryable
		cfg.Lookup = sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			chs, err := p.client.LookupByReference(ctx, key)
			if err != nil || len(chs) == 0 {
				return sideeffect.LookupResult{}, err
			}
			return sideeffect.LookupResult{Found: true, Failed: chs[0].Status != provider.ChargeSucceeded}, nil
		})
	default:
		cfg.Mode = sideeffect.Idempotent
	}
	c, err := sideeffect.New(e.app, cfg)
	if err != nil {
		return nil, err
	}
	return &ilvPayer{p: p, cfg: cfg, caller: c}, nil
}

// frozen returns a Caller like the payer's whose process freezes right
// after its claim (a GC pause, SIGSTOP, a frozen VM): its clock's first
// reading (the claim's) is free; the next one closes in and waits for gate,
// then reads the clock, which the ticks meanwhile moved. For a new attempt
// (the common case) that next reading is Do's check of its lease just
// before the call; for an attempt that exists already (a redelivery) it
// comes before the transaction that claims it, so the freeze is then
// before the claim, which is harmless.
func (py *ilvPayer) frozen(e *ilvEnv, gate, in chan struct{}) (*sideeffect.Caller, error) {
	cfg := py.cfg
	readings := 0
	var mu sync.Mutex
	clock := cfg.Clock
	cfg.Clock = func() time.Time {
		mu.Lock()
		readings++
		n := readings
		mu.Unlock()
		if n == 2 {
			close(in)
			<-gate
		}
		return clock()
	}
	return sideeffect.New(e.app, cfg)
}

// ilvPaused is a worker paused between its Caller's claim and its call.
type ilvPaused struct {
	msg  outbox.Message
	gate chan struct{} // closed: the call goes on
	done chan error    // Do's outcome
	in   chan struct{} // closed once the call is reached (the claim is taken)
}

// charge runs the Caller for m; with gate, a frozen one (in is closed once
// it is frozen after its claim).
func (py *ilvPayer) charge(ctx context.Context, e *ilvEnv, m outbox.Message, gate, in chan struct{}) error {
	key := m.ID.String()
	caller := py.caller
	if gate != nil {
		var err error
		if caller, err = py.frozen(e, gate, in); err != nil {
			close(in)
			return err
		}
	}
	_, err := caller.Do(ctx, key, []byte(key), func(ctx context.Context, key string) ([]byte, error) {
		ch, err := py.p.client.Charge(ctx, key, provider.ChargeRequest{Reference: key, Amount: 100, Currency: "eur"})
		switch {
		case err == nil:
			return []byte(ch.ID), nil
		case errors.Is(err, provider.ErrDeclined), errors.Is(err, provider.ErrInvalid), errors.Is(err, provider.ErrKeyReused):
			return nil, sideeffect.Rejected(err)
		}
		return nil, err
	})
	if gate != nil {
		select {
		case <-in:
		default:
			close(in) // Do returned without reading its clock again
		}
	}
	return err
}

// pay charges for m before the inbox applies it; false: not now (the call's
// outcome is unknown, another caller holds the key, it is parked), the
// event is redelivered later.
func (c *ilvConsumer) pay(w *world, m *outbox.Message) (bool, error) {
	if w.payer == nil {
		return true, nil
	}
	if err := w.payer.charge(w.ctx, w.env, *m, nil, nil); err != nil {
		w.note("charge %s#%d: %v", ilvAggName(m.AggregateID), m.Sequence, err)
		return false, nil
	}
	return true, nil
}

// pause makes worker i handle what it holds with its call held after the
// Caller's claim.
func (c *ilvConsumer) pause(w *world, i int) error {
	m := c.held[i]
	if m == nil || w.payer == nil || c.paused[i] != nil {
		return nil
	}
	c.held[i] = nil
	p := &ilvPaused{msg: *m, gate: make(chan struct{}), done: make(chan error, 1), in: make(chan struct{})}
	go func() { p.done <- w.payer.charge(context.WithoutCancel(w.ctx), w.env, p.msg, p.gate, p.in) }()
	<-p.in
	c.paused[i] = p
	return nil
}

// resume lets paused worker i call, then handle its message.
func (c *ilvConsumer) resume(w *world, i int) error {
	p := c.paused[i]
	if p == nil {
		return nil
	}
	c.paused[i] = nil
	close(p.gate)
	select {
	case err := <-p.done:
		if err != nil {
			w.note("paused charge %s#%d: %v", ilvAggName(p.msg.AggregateID), p.msg.Sequence, err)
			c.queue = append(c.queue, p.msg)
			return nil
		}
	case <-time.After(30 * time.Second):
		return errors.New("a paused charge did not end within 30s of its resumption")
	}
	return c.handleMsg(w, &p.msg)
}

// resumeStep lets a worker paused in its charge go on.
type resumeStep struct{ c int }

func (s resumeStep) String() string { return fmt.Sprintf("resume c%d", s.c+1) }

func (s resumeStep) run(w *world) error {
	if s.c >= len(w.consumer.paused) {
		return nil
	}
	return w.consumer.resume(w, s.c)
}

func parseResume(a []string) (ilvStep, error) {
	if len(a) != 1 || !strings.HasPrefix(a[0], "c") {
		return nil, errors.New("want: resume cN")
	}
	n, err := strconv.Atoi(a[0][1:])
	return resumeStep{c: n - 1}, err
}

func genResume(g *ilvGen) ilvStep {
	if g.cfg.payer == "" {
		return nil
	}
	return resumeStep{c: g.rng.IntN(g.cfg.workers)}
}

// providerStep injects a provider fault for its next charge: "timeout"
// (it commits, then answers nothing until the caller gives up).
type providerStep struct{ fault string }

func (s providerStep) String() string { return "provider " + s.fault }

func (s providerStep) run(w *world) error {
	if w.payer == nil {
		return nil
	}
	return w.payer.p.svc.SetFaults(provider.Faults{Seed: 1, Rules: []provider.Rule{{Fault: provider.FaultTimeoutAfterCommit, On: "charges", Next: 1,
		Hang: provider.Duration(2 * ilvCallTimeout)}}})
}

func parseProvider(a []string) (ilvStep, error) {
	if len(a) != 1 || a[0] != "timeout" {
		return nil, errors.New("want: provider timeout")
	}
	return providerStep{fault: a[0]}, nil
}

func genProvider(g *ilvGen) ilvStep {
	if g.cfg.payer == "" {
		return nil
	}
	return providerStep{fault: "timeout"}
}

// checkCharges is I6: the provider's ledger holds at most one charge per
// event (key), and every event the consumer applied was charged.
func (w *world) checkCharges() error {
	if w.payer == nil {
		return nil
	}
	l, err := w.payer.p.svc.Ledger(w.ctx, "")
	if err != nil {
		return err
	}
	charged := map[string]int{}
	for _, e := range l.Entries {
		if e.Kind == "charge" {
			charged[e.Reference]++
		}
	}
	for ref, n := range charged {
		if n > 1 {
			name := ref
			if id, err := uuid.Parse(ref); err == nil && w.byID[id] != nil {
				name = w.byID[id].name()
			}
			w.violate("I6", "%s charged %d times at the provider", name, n)
		}
	}
	return nil
}
