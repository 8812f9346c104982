package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/examples/orders/saga"
	"github.com/pgoutbox/outbox/internal/chaos"
	"github.com/pgoutbox/outbox/internal/destination"
)

// demoSaga is the order saga in the demo: the payment provider, the
// payments consumer and the saga consumer, in this process like the rest.
// It runs on a NATS destination (the saga's consumers read JetStream).
type demoSaga struct {
	mode     provider.Mode
	prov     *provider.Service
	srv      *http.Server
	client   *provider.Client
	payments *payments.Consumer
	saga     *saga.Consumer
	closeNC  func()
	js       jetstream.JetStream
}

// sagaSupported says whether the destination carries the saga.
func sagaSupported(dest chaos.Destination) bool {
	scheme, _, _ := strings.Cut(dest.URL(), "://")
	return scheme == "nats" || scheme == "tls"
}

// setUpSaga migrates and builds the saga's parts (after setUp).
func (d *demoRun) setUpSaga(ctx context.Context) error {
	mode, err := provider.ParseMode(d.flags.providerMode)
	if err != nil {
		return err
	}
	s := &demoSaga{mode: mode}
	if err := payments.Migrate(ctx, d.pool, d.where.Schema, ""); err != nil {
		return err
	}
	var faults provider.Faults
	for part := range strings.SplitSeq(d.flags.providerFaults, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		r, err := provider.ParseRule(part)
		if err != nil {
			return fmt.Errorf("--provider-faults: %w", err)
		}
		faults.Rules = append(faults.Rules, r)
	}
	faults.Seed = d.flags.seed
	// The provider tells which requests it injected a fault into; the
	// payments consumer's client labels their errors (demo_injected.go).
	injected := &injectedFaults{}
	if s.prov, err = provider.New(d.pool, provider.Config{Schema: d.where.Schema, Mode: mode, Faults: faults, Logger: d.log, OnFault: injected.onFault}); err != nil {
		return err
	}
	if err := s.prov.Migrate(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.srv = &http.Server{Handler: s.prov.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	hc := payments.HTTPClient()
	hc.Transport = injected.transport(hc.Transport)
	s.client = provider.NewClient("http://"+ln.Addr().String(), "", hc)
	opts, _, err := destinationFlags(d.dest, chaos.RoleConsumer)
	if err != nil {
		return err
	}
	nc, err := destination.ConnectNATS(d.dest.URL(), "outbox-demo-saga")
	if err != nil {
		return err
	}
	s.closeNC = nc.Close
	if s.js, err = jetstream.New(nc); err != nil {
		return err
	}
	if s.payments, err = payments.New(d.pool, payments.Config{Settings: payments.Settings{Schema: d.where.Schema, Stream: opts.NATSStream,
		SubjectPrefix: opts.NATSSubjectPrefix, AckWait: 30 * time.Second, Logger: d.log}, Provider: s.client, Mode: mode,
		// Mode neither: park the call after a lost response (the
		// default), or with --blind-retry call again, so that the
		// duplicates it causes are measured.
		BlindRetry:  d.flags.blindRetry,
		CallTimeout: 5 * time.Second, CheckInterval: 100 * time.Millisecond}); err != nil {
		return err
	}
	if s.saga, err = saga.New(d.pool, d.api, saga.Config{Settings: saga.Settings{Schema: d.where.Schema, Stream: opts.NATSStream,
		SubjectPrefix: opts.NATSSubjectPrefix, Logger: d.log}}); err != nil {
		return err
	}
	d.saga = s
	return nil
}

// neitherNote says, in the saga's line of the run's header, what mode
// neither does with an unknown outcome.
func neitherNote(mode provider.Mode, blindRetry bool) string {
	switch {
	case mode != provider.ModeNeither:
		return ""
	case blindRetry:
		return "; an unknown outcome is called again (--blind-retry: possible duplicate charges, counted; I7 relaxed)"
	}
	return "; an unknown outcome is parked for an operator (the default; --blind-retry calls again)"
}

// runSaga starts the saga's consumers in g.
func (d *demoRun) runSaga(ctx context.Context, g *errgroup.Group) {
	s := d.saga
	g.Go(func() error { return componentDone("payments consumer", ctx, s.payments.Run(ctx, s.js)) })
	g.Go(func() error { return componentDone("saga consumer", ctx, s.saga.Run(ctx, s.js)) })
}

// waitSaga waits until every order's saga is settled (I7).
func (d *demoRun) waitSaga(ctx context.Context) error {
	f, err := chaos.WaitSagaSettled(ctx, d.pool, d.where, d.saga.ledger, d.saga.mode)
	if err != nil {
		return err
	}
	d.printf("  [%5.1fs] sagas settled: %d confirmed, %d cancelled, %d parked\n", time.Since(d.start).Seconds(), f.Confirmed, f.Cancelled, f.Parked)
	return nil
}

func (s *demoSaga) ledger(ctx context.Context) (provider.Ledger, error) {
	return s.client.Ledger(ctx, "")
}

// checkSaga adds I6, I7 and the saga's figures to rep.
func (d *demoRun) checkSaga(ctx context.Context, rep *chaos.Report) error {
	l, err := d.saga.ledger(ctx)
	if err != nil {
		return fmt.Errorf("provider ledger: %w", err)
	}
	return chaos.CheckSaga(ctx, d.pool, d.where, l, d.saga.mode, rep)
}

func (s *demoSaga) close() error {
	if s == nil {
		return nil
	}
	s.prov.StopHanging()
	if s.closeNC != nil {
		s.closeNC()
	}
	// The run is over and checked: give requests in flight a moment, then
	// close what is left. A connection the payments consumer dialled just
	// before it stopped, and never sent a request on, counts as busy for 5
	// s to Shutdown (net/http waits that long for a new connection's first
	// request), which made the demo fail after it had passed.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if err := s.srv.Close(); err != nil {
			return err
		}
	}
	return nil
}
