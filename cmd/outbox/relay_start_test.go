package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// freePort returns a TCP port on 127.0.0.1 that nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// readyz returns the relay's /readyz status code and body.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metricsAddr waits for the relay to report its metrics address.
func (p *relayProcess) metricsAddr(t *testing.T) string {
	t.Helper()
	select {
	case addr := <-p.addr:
		return addr
	case err := <-p.waitErr:
		t.Fatalf("relay exited: %v\n%s", err, p.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not report its metrics address:\n%s", p.log())
	}
	return ""
}

// waitingFor waits until the relay logged at least two retries while
// waiting for what, checks that it is still running and that /readyz says
// it is not ready because of that.
func (p *relayProcess) waitingFor(t *testing.T, addr, what string) {
	t.Helper()
	line := `msg="waiting for the ` + what + `"`
	outboxtest.Eventually(t, 30*time.Second, "relay logs retries for the "+what, func() bool {
		return strings.Count(p.log(), line) >= 2
	})
	select {
	case err := <-p.waitErr:
		t.Fatalf("relay exited while waiting for the %s: %v\n%s", what, err, p.log())
	default:
	}
	if code, body := readyz(t, addr); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for the "+what) {
		t.Fatalf("/readyz while waiting for the %s: %d %q, want 503 saying so", what, code, body)
	}
}

// stop sends SIGTERM and wants a clean exit (code 0).
func (p *relayProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.waitErr:
		if err != nil {
			t.Fatalf("relay exit after SIGTERM: %v\n%s", err, p.log())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not stop after SIGTERM:\n%s", p.log())
	}
}

// allPublished reports whether the schema has no unpublished event left.
func allPublished(ctx context.Context, pool *pgxpool.Pool, schema string) bool {
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&n)
	return n == 0
}

// TestRelayWaitsForBrokerAtStart starts `outbox relay` before its broker:
// it stays up, logs its retries and answers 503 on /readyz; once a NATS
// server appears on the address, it publishes the pending event and /readyz
// turns 200.
func TestRelayWaitsForBrokerAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	insertEvent(t, pool, schema, "o1", 1, "")
	port := freePort(t)
	cfg := natstest.Config(t)
	relay := startRelayProcess(t, "--schema", schema, "--destination", fmt.Sprintf("nats://127.0.0.1:%d", port),
		"--nats-stream", cfg.Stream, "--nats-subject-prefix", cfg.SubjectPrefix, "--metrics-addr", "127.0.0.1:0",
		"--poll-interval", "50ms")
	addr := relay.metricsAddr(t)
	relay.waitingFor(t, addr, "destination")

	broker, err := outboxnats.StartEmbedded(t.TempDir(), port)
	if err != nil {
		t.Fatalf("start NATS on port %d: %v", port, err)
	}
	t.Cleanup(broker.Shutdown)
	outboxtest.Eventually(t, 60*time.Second, "event published once the broker is up", func() bool { return allPublished(ctx, pool, schema) })
	outboxtest.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := readyz(t, addr); return code == http.StatusOK })
	js := natstest.JetStream(t, natstest.Connect(t, broker.ClientURL()))
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream %s: info %v, err %v; want 1 message", cfg.Stream, info, err)
	}
	relay.stop(t)
}

// TestRelayWaitsForDatabaseAtStart starts `outbox relay` with its database
// unreachable (a port where PostgreSQL will be forwarded later): it stays
// up, logs its retries and answers 503 on /readyz, then relays once the
// database answers.
func TestRelayWaitsForDatabaseAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	insertEvent(t, pool, schema, "o1", 1, "")
	nc := natstest.Conn(t)
	cfg := natstest.Config(t)
	natstest.DeleteStreamAtCleanup(t, natstest.JetStream(t, nc), cfg.Stream)

	dbURL, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	target := dbURL.Host
	port := freePort(t)
	dbURL.Host = fmt.Sprintf("127.0.0.1:%d", port)
	relay := startRelayProcess(t, "--database-url", dbURL.String(), "--schema", schema, "--destination", outboxtest.NATSURL(),
		"--nats-stream", cfg.Stream, "--nats-subject-prefix", cfg.SubjectPrefix, "--metrics-addr", "127.0.0.1:0",
		"--poll-interval", "50ms")
	addr := relay.metricsAddr(t)
	relay.waitingFor(t, addr, "database")

	// PostgreSQL appears on the relay's address.
	ln, err := net.Listen("tcp", dbURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	forward(t, ln, target)
	outboxtest.Eventually(t, 60*time.Second, "event published once the database answers", func() bool { return allPublished(ctx, pool, schema) })
	outboxtest.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := readyz(t, addr); return code == http.StatusOK })
	relay.stop(t)
}

// TestRelayStopsWhileWaiting: SIGTERM while the relay waits for its broker
// ends it promptly and cleanly.
func TestRelayStopsWhileWaiting(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	relay := startRelayProcess(t, "--schema", schema, "--destination", fmt.Sprintf("nats://127.0.0.1:%d", freePort(t)),
		"--metrics-addr", "127.0.0.1:0")
	relay.waitingFor(t, relay.metricsAddr(t), "destination")
	relay.stop(t)
	if !strings.Contains(relay.log(), `msg="relay stopped before it started"`) {
		t.Fatalf("relay log:\n%s", relay.log())
	}
}

// forward accepts connections on ln and relays each to target, until the
// test ends.
func forward(t *testing.T, ln net.Listener, target string) {
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
}
