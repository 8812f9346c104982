package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// benchOutage is the "outage" group (only when named): how long a short
// destination outage and a few throttled requests delay events (issue 19,
// item 7).
//
//   - outage/nats-2s: writers commit 500 events/s (one per transaction, the
//     latency runs' load, woken relay at the library's defaults) to a NATS
//     server of the bench's own, which is stopped for 2 s in the middle of
//     the run and started again on its data. Commit to acknowledgement for
//     the events committed during the outage: target max ≤ outage + 2 s.
//   - outage/webhook-503 and outage/webhook-500: a backlog drained to an
//     HTTP endpoint that answers a random 5% of the requests 503 with
//     Retry-After: 1 (throttled), or 500 (a plain failure). Target: the 503
//     drain takes at most 1.2× the 500 drain.
func benchOutage(ctx context.Context, e *env) ([]Result, error) {
	out, err := outageNATS(ctx, e, 500, 2*time.Second)
	if err != nil {
		return out, err
	}
	rs, err := outageWebhook(ctx, e)
	return append(out, rs...), err
}

// outageNATS runs outage/nats-2s at rate events/s with an outage of down.
func outageNATS(ctx context.Context, e *env, rate int, down time.Duration) ([]Result, error) {
	dir, err := os.MkdirTemp("", "outbox-bench-nats-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := outboxnats.StartEmbedded(dir, 0)
	if err != nil {
		return nil, err
	}
	defer func() { srv.Shutdown() }()
	url := srv.ClientURL()
	port, err := strconv.Atoi(url[len("nats://127.0.0.1:"):])
	if err != nil {
		return nil, fmt.Errorf("embedded NATS URL %s: %w", url, err)
	}
	s, cleanup, err := e.newSpace(ctx, "outage-nats")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// The reconnect settings of "outbox relay" (internal/destination).
	nc, err := nats.Connect(url, nats.Name("outbox-bench-outage"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	pub, err := outboxnats.NewPublisher(ctx, js, outboxnats.Config{Stream: s.stream, SubjectPrefix: s.prefix})
	if err != nil {
		nc.Close()
		return nil, err
	}
	load, err := newOrderLoad(ctx, e, s)
	if err != nil {
		nc.Close()
		return nil, err
	}
	defer load.Close()
	rec := &ackRecorder{acks: map[uuid.UUID]time.Time{}}
	ph := &phases{}
	r, stopRelay, err := startRelayTo(ctx, e, s, pub, nc.Close, outbox.RelayConfig{Observer: ph},
		func(p outbox.Publisher) outbox.Publisher { rec.next = p; return rec })
	if err != nil {
		return nil, err
	}
	defer func() { _ = stopRelay() }()
	notifier, err := outbox.NewNotifier(load.pool, outbox.NotifierConfig{Schema: s.schema, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	defer notifier.Close()
	time.Sleep(300 * time.Millisecond) // relay started and listening

	before, after := 3*time.Second, 3*time.Second
	var downAt, upAt time.Time
	faults := make(chan error, 1)
	go func() {
		if err := sleepCtx(ctx, before); err != nil {
			faults <- err
			return
		}
		srv.Shutdown()
		downAt = time.Now()
		if err := sleepCtx(ctx, down); err != nil {
			faults <- err
			return
		}
		srv2, err := outboxnats.StartEmbedded(dir, port)
		upAt = time.Now()
		if err == nil {
			srv = srv2
		}
		faults <- err
	}()
	e.logf("outage/nats: %d events/s for %s; the server stops after %s for %s", rate, before+down+after, before, down)
	commits, offered, elapsed, err := load.offerAt(ctx, rate, before+down+after, notifier.Notify)
	if ferr := <-faults; ferr != nil {
		return nil, fmt.Errorf("restart the NATS server: %w", ferr)
	}
	if err != nil {
		return nil, err
	}
	e.logf("outage/nats: relay %s", ph.String(elapsed))
	if _, err := rec.latencies(commits); err != nil {
		return nil, err
	}
	var during []time.Duration
	var lastAck time.Time
	rec.mu.Lock()
	for id, c := range commits {
		if c.After(downAt) && c.Before(upAt) {
			ack := rec.acks[id]
			during = append(during, ack.Sub(c))
			if ack.After(lastAck) {
				lastAck = ack
			}
		}
	}
	rec.mu.Unlock()
	var attempts int
	var pushed time.Duration
	if err := e.admin.QueryRow(ctx, `SELECT coalesce(max(attempt_count), 0),
		coalesce(max(extract(epoch FROM available_at - occurred_at)), 0) * interval '1 second' FROM `+s.schema+`.outbox_events`).
		Scan(&attempts, &pushed); err != nil {
		return nil, err
	}
	outage := upAt.Sub(downAt)
	p50, p99, mx := percentiles(during)
	st := r.Stats()
	e.logf("outage/nats: %d events committed during the %s outage: commit to ack p50 %.0f ms, p99 %.0f ms, max %.0f ms; the last acknowledged %s after the return; outage looks %d; most attempts %d; available_at pushed at most %s",
		len(during), outage.Round(time.Millisecond), p50, p99, mx, lastAck.Sub(upAt).Round(time.Millisecond), st.Outages, attempts, pushed.Round(time.Millisecond))
	target := outage + 2*time.Second
	return []Result{{Scenario: "outage/nats-2s", P50: f(p50), P99: f(p99), Max: f(mx), Events: int64(len(during)),
		EventsPerSec: f(offered),
		Target:       fmt.Sprintf("max ≤ %.1f s", target.Seconds()), Met: b(time.Duration(mx*float64(time.Millisecond)) <= target),
		Note: fmt.Sprintf("commit → ack of the %d events committed during a %s NATS outage at %.0f events/s (Notifier, defaults); last ack %s after the return; %d outage looks, %d attempts spent at most, available_at pushed %s at most",
			len(during), outage.Round(time.Millisecond), offered, lastAck.Sub(upAt).Round(time.Millisecond), st.Outages, attempts, pushed.Round(time.Millisecond))}}, nil
}

// flakyEndpoint answers a random share of the requests with code (with
// Retry-After: 1 for 503), and hands the others to a verifying receiver.
type flakyEndpoint struct {
	srv    *http.Server
	served chan error
	url    string
	mu     sync.Mutex
	failed int
	oc     *orderCheck
}

func startFlakyEndpoint(code int, share float64, secrets []string) (*flakyEndpoint, error) {
	fe := &flakyEndpoint{served: make(chan error, 1), oc: newOrderCheck()}
	rc, err := outboxwebhook.NewReceiver(secrets, func(_ context.Context, m outbox.Message) error {
		_ = fe.oc.add(m, "the endpoint") // checked by result
		return nil
	}, outboxwebhook.ReceiverOptions{})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	fe.url = "http://" + ln.Addr().String() + "/events"
	fe.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mrand.Float64() < share {
			fe.mu.Lock()
			fe.failed++
			fe.mu.Unlock()
			if code == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			w.WriteHeader(code)
			return
		}
		rc.ServeHTTP(w, r)
	})}
	go func() { fe.served <- fe.srv.Serve(ln) }()
	return fe, nil
}

func (fe *flakyEndpoint) close() error {
	_ = fe.srv.Close()
	if err := <-fe.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// outageWebhook drains the same backlog to an endpoint failing 5% of the
// requests with 503 (Retry-After: 1) and with 500, alternating, three
// rounds each, and compares the median drain times.
func outageWebhook(ctx context.Context, e *env) ([]Result, error) {
	n, aggs := 2000, 200
	if e.o.quick {
		n, aggs = 500, 50
	}
	const share = 0.05
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	secrets := []string{"whsec_" + base64.StdEncoding.EncodeToString(key)}
	times := map[int][]time.Duration{}
	failed := map[int]int{}
	var outages int64
	for round := 0; round < 3; round++ {
		order := []int{http.StatusServiceUnavailable, http.StatusInternalServerError}
		if round%2 == 1 {
			order = []int{order[1], order[0]}
		}
		for _, code := range order {
			s, cleanup, err := e.newSpace(ctx, fmt.Sprintf("outage-webhook-%d-%d", code, round))
			if err != nil {
				return nil, err
			}
			if err := e.loadBacklog(ctx, s.schema, n, aggs, "o-", 1<<40, false); err != nil {
				cleanup()
				return nil, err
			}
			fe, err := startFlakyEndpoint(code, share, secrets)
			if err != nil {
				cleanup()
				return nil, err
			}
			pub, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: fe.url, Secrets: secrets})
			if err != nil {
				_ = fe.close()
				cleanup()
				return nil, err
			}
			elapsed, r, err := drainOursTo(ctx, e, s, pub, n, func(c *outbox.RelayConfig) { c.DisableNotify = true })
			pub.Close()
			cerr := fe.close()
			cleanup()
			if err != nil {
				return nil, fmt.Errorf("drain with %d answers: %w", code, err)
			}
			if cerr != nil {
				return nil, cerr
			}
			if _, err := fe.oc.result(); err != nil {
				return nil, err
			}
			times[code] = append(times[code], elapsed)
			fe.mu.Lock()
			failed[code] += fe.failed
			fe.mu.Unlock()
			if code == http.StatusServiceUnavailable {
				outages += r.Stats().Outages
			}
			e.logf("outage/webhook-%d round %d: %d events in %s (%d answers %d)", code, round+1, n, elapsed.Round(time.Millisecond), fe.failed, code)
		}
	}
	median := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	t503, t500 := median(times[http.StatusServiceUnavailable]), median(times[http.StatusInternalServerError])
	ratio := t503.Seconds() / t500.Seconds()
	note := fmt.Sprintf("median of 3 drains of %d events over %d aggregates; a random %.0f%% of the requests answered", n, aggs, share*100)
	return []Result{
		{Scenario: "outage/webhook-503", EventsPerSec: f(float64(n) / t503.Seconds()), Seconds: t503.Seconds(), Events: int64(n),
			Ratio: f(ratio), RatioOf: "outage/webhook-500", Target: "≤ 1.2× the 500 drain", Met: b(ratio <= 1.2),
			Note: fmt.Sprintf("%s 503 with Retry-After: 1 (%d in all); %d relay-wide outage looks", note, failed[http.StatusServiceUnavailable], outages)},
		{Scenario: "outage/webhook-500", EventsPerSec: f(float64(n) / t500.Seconds()), Seconds: t500.Seconds(), Events: int64(n),
			Note: fmt.Sprintf("%s 500 (%d in all)", note, failed[http.StatusInternalServerError])},
	}, nil
}
