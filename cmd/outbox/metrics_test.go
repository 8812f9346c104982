package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxprom"
)

// relayProcess is `outbox relay` running as a child process.
type relayProcess struct {
	cmd     *exec.Cmd
	addr    chan string
	mu      sync.Mutex
	stderr  strings.Builder
	waitErr chan error    // the exit's error, once; a test that reads it owns it
	exited  chan struct{} // closed once the process has exited
}

var metricsAddrRE = regexp.MustCompile(`msg="metrics listening" addr=(\S+)`)

func startRelayProcess(t *testing.T, args ...string) *relayProcess {
	t.Helper()
	return startRelayProcessEnv(t, append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL(), "OUTBOX_FAILPOINTS="), args...)
}

// startRelayProcessEnv is startRelayProcess with the relay's whole
// environment given: env, nothing inherited.
func startRelayProcessEnv(t *testing.T, env []string, args ...string) *relayProcess {
	t.Helper()
	p := &relayProcess{addr: make(chan string, 1), waitErr: make(chan error, 1), exited: make(chan struct{})}
	p.cmd = exec.Command(outboxBinary(t), append([]string{"relay"}, args...)...)
	p.cmd.Env = env
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr.WriteString(line + "\n")
			p.mu.Unlock()
			if m := metricsAddrRE.FindStringSubmatch(line); m != nil {
				p.addr <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		err := p.cmd.Wait()
		close(p.exited)
		p.waitErr <- err
	}()
	// The clean-up waits for the exit on exited, not waitErr: a test that
	// stopped the relay has read waitErr already, and the clean-up then
	// waited its 10 s for nothing (most of each relay test's time).
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
	})
	return p
}

func (p *relayProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// TestRelayMetricsEndpointAndAlertRules runs `outbox relay --metrics-addr`
// against a schema holding old published events (for the periodic
// clean-up), events blocked behind a poison event the broker refuses (too
// large for NATS: permanent, quarantined) and healthy events. The scrape
// shows what the database holds; the shipped alert rules and the dashboard
// only use series the relay (or an inbox) really exports; the quarantine
// and oldest-age alerts fire on that scrape; SIGTERM stops the relay cleanly.
func TestRelayMetricsEndpointAndAlertRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	nc := natstest.Conn(t)
	js := natstest.JetStream(t, nc)
	cfg := natstest.Config(t)
	natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)

	seedForCleanup(t, pool, schema, 12) // 12 old published events, protected rows, inbox rows
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), 'order', 'big', 1, 'Huge', jsonb_build_object('blob', repeat('x', $1::int)), now() - interval '10 minutes'`, nc.MaxPayload()+1); err != nil {
		t.Fatal(err)
	}
	insertEvent(t, pool, schema, "big", 2, "occurred_at = now() - interval '10 minutes'") // blocked, old
	for i := 0; i < 5; i++ {
		insertEvent(t, pool, schema, fmt.Sprintf("ok%d", i), 1, "")
	}

	relay := startRelayProcess(t, "--schema", schema, "--destination", outboxtest.NATSURL(), "--nats-stream", cfg.Stream,
		"--nats-subject-prefix", cfg.SubjectPrefix, "--metrics-addr", "127.0.0.1:0", "--metrics-db-interval", "1ns",
		"--cleanup-older-than", "1h", "--cleanup-interval", "50ms", "--poll-interval", "50ms", "--heartbeat-interval", "100ms")
	var addr string
	select {
	case addr = <-relay.addr:
	case err := <-relay.waitErr:
		t.Fatalf("relay exited: %v\n%s", err, relay.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not report its metrics address:\n%s", relay.log())
	}
	base := "http://" + addr

	// The relay publishes the healthy events (and "stuck"), quarantines the
	// huge one and cleans up the 12 old ones.
	outboxtest.Eventually(t, 60*time.Second, "healthy events published, poison quarantined, old events cleaned up", func() bool {
		var pending, quarantined, old int
		_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL),
			count(*) FILTER (WHERE quarantined_at IS NOT NULL AND published_at IS NULL),
			count(*) FILTER (WHERE aggregate_id LIKE 'old-%') FROM `+schema+`.outbox_events`).Scan(&pending, &quarantined, &old)
		return pending == 1 && quarantined == 2 && old == 0
	})
	fams, err := promrules.Scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var pending, quarantined, published int
	var oldest float64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL),
		count(*) FILTER (WHERE quarantined_at IS NOT NULL AND published_at IS NULL),
		count(*) FILTER (WHERE published_at IS NOT NULL AND skipped_at IS NULL AND published_at > now() - interval '1 hour' AND aggregate_id <> 'recent'),
		coalesce(extract(epoch FROM now() - min(occurred_at) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL)), 0)::float8
		FROM `+schema+`.outbox_events`).Scan(&pending, &quarantined, &published, &oldest); err != nil {
		t.Fatal(err)
	}
	s := map[string]string{"schema": schema}
	with := func(k, v string) map[string]string { return map[string]string{"schema": schema, k: v} }
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"outbox_pending_events", s, float64(pending)},
		{"outbox_quarantined_events", s, float64(quarantined)},
		{"outbox_published_total", s, float64(published)},
		{"outbox_failures_total", with("reason", "permanent"), 1},
		{"outbox_quarantined_total", s, 1},
		{"outbox_cleanup_deleted_total", with("table", "outbox_events"), 12},
		{"outbox_relays_alive", s, 1},
		{"outbox_relay_up", s, 1},
	} {
		if got, ok := promrules.Value(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("scraped %s%v = %g (found %v); the database (or what happened) says %g", c.name, c.labels, got, ok, c.want)
		}
	}
	if got, _ := promrules.Value(fams, "outbox_oldest_pending_age_seconds", s); got < oldest-5 || got > oldest+5 || got < 590 {
		t.Errorf("scraped outbox_oldest_pending_age_seconds %g, the database says %g", got, oldest)
	}

	// Every series the alert rules and the dashboard use is exported: by
	// this relay, or (inbox_*) by a consumer's inbox with the same metrics.
	exported := promrules.Exported(fams)
	consumer, err := outboxprom.New(outboxprom.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	consumer.ObserveHandle(inbox.HandleObservation{Consumer: "c", Outcome: inbox.Applied})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(consumer)
	inboxFams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	inboxExported := map[string]bool{}
	for _, f := range inboxFams {
		if strings.HasPrefix(f.GetName(), "inbox_") {
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				inboxExported[f.GetName()+suffix] = true
			}
		}
	}
	groups, err := promrules.Load("../../deploy/prometheus/outbox-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]string{}
	for _, g := range groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
			series, err := promrules.Series(r.Expr)
			if err != nil || len(series) == 0 {
				t.Fatalf("alert %s: %v (series %v)", r.Alert, err, series)
			}
			for _, name := range series {
				if !exported[name] {
					t.Errorf("alert %s uses %s, which the relay does not export", r.Alert, name)
				}
			}
		}
	}
	for _, want := range []string{"OutboxOldestPendingTooOld", "OutboxQuarantined", "OutboxNoRelayAlive", "OutboxExpiredClaimsRising"} {
		if alerts[want] == "" {
			t.Errorf("alert rules lack %s", want)
		}
	}
	checkDashboard(t, "../../deploy/grafana/outbox-dashboard.json", 15, func(name string) bool { return exported[name] || inboxExported[name] })
	// On this scrape, the poison fires the quarantine alert, and the event
	// blocked behind it (10 minutes old) the oldest-age alert.
	for _, name := range []string{"OutboxQuarantined", "OutboxOldestPendingTooOld"} {
		got, err := promrules.Eval(alerts[name], fams)
		if err != nil || len(got) != 1 || got[0].Labels["schema"] != schema {
			t.Errorf("alert %s evaluated to %v, %v; want it firing for schema %s", name, got, err, schema)
		}
	}

	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if err := relay.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-relay.waitErr:
		if err != nil {
			t.Fatalf("relay did not stop cleanly on SIGTERM: %v\n%s", err, relay.log())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not stop on SIGTERM:\n%s", relay.log())
	}
	var relays int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_relays`).Scan(&relays); err != nil || relays != 0 {
		t.Fatalf("%d heartbeat rows after a clean stop (err %v), want 0", relays, err)
	}
}

// checkDashboard checks that a shipped Grafana dashboard has at least min
// queries and that every series they use is one exported says is scraped.
func checkDashboard(t *testing.T, path string, min int, exported func(name string) bool) {
	t.Helper()
	exprs, err := promrules.DashboardExprs(path)
	if err != nil || len(exprs) < min {
		t.Fatalf("dashboard %s: %d expressions, %v", path, len(exprs), err)
	}
	for _, e := range exprs {
		series, err := promrules.Series(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range series {
			if !exported(name) {
				t.Errorf("dashboard %s: query %q uses %s, which nothing scraped exports", path, e, name)
			}
		}
	}
}
