package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/testcert"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

// TestRelayPublishesToNATSOverTLS runs `outbox relay` against a NATS
// server that takes only TLS with a client certificate its CA signed. With
// ca_file, cert_file and key_file in the destination URL the relay
// publishes and the stream stores the event. A relay that trusts only the
// system's roots, one that trusts another CA and one without a client
// certificate fail the handshake: each waits for the destination, logging
// why, and the pending event spends no attempt (unavailable, not failed).
func TestRelayPublishesToNATSOverTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca := testcert.NewCA(t, "nats")
	client := ca.Client(t, "client", "relay")
	server := natstest.EmbeddedTLS(t, ca.ServerConfig(t, ca.Server(t, "server")))
	pool, schema := outboxtest.Schema(t)
	env := append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL(), "OUTBOX_FAILPOINTS=")
	relay := func(query string) *process {
		return startProcess(t, env, "relay", "--schema", schema, "--poll-interval", "50ms",
			"--destination", server+"?stream=TLS&subject_prefix=tls&"+query)
	}
	good := fmt.Sprintf("ca_file=%s&cert_file=%s&key_file=%s", ca.CertFile, client.CertFile, client.KeyFile)

	insertEvent(t, pool, schema, "o-tls", 1, "")
	p := relay(good)
	outboxtest.Eventually(t, 60*time.Second, "the relay publishes over TLS", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NOT NULL`).Scan(&n)
		return n == 1
	})
	p.stop(t)
	tc, err := tlsfiles.Files{CA: ca.CertFile, Cert: client.CertFile, Key: client.KeyFile}.Config(nil)
	if err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, server, nats.Secure(tc))
	st, err := natstest.JetStream(t, nc).Stream(ctx, "TLS")
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := st.GetMsg(ctx, 1); err != nil || msg.Subject != "tls.order.o-tls" {
		t.Fatalf("the stream's first message: %v, %v; want the event on tls.order.o-tls", msg, err)
	}

	insertEvent(t, pool, schema, "o-tls", 2, "")
	other := testcert.NewCA(t, "other")
	for name, c := range map[string]struct{ query, want string }{
		"system roots only":     {fmt.Sprintf("cert_file=%s&key_file=%s", client.CertFile, client.KeyFile), "certificate signed by unknown authority"},
		"another CA":            {fmt.Sprintf("ca_file=%s&cert_file=%s&key_file=%s", other.CertFile, client.CertFile, client.KeyFile), "certificate signed by unknown authority"},
		"no client certificate": {"ca_file=" + ca.CertFile, "certificate required"},
	} {
		p := relay(c.query)
		outboxtest.Eventually(t, 60*time.Second, name+": the relay waits for the destination, saying why", func() bool {
			out := p.out.String()
			return strings.Count(out, "waiting for the destination") >= 2 && strings.Contains(out, c.want)
		})
		p.stop(t)
		var attempts int
		var published *time.Time
		if err := pool.QueryRow(ctx, `SELECT attempt_count, published_at FROM `+schema+`.outbox_events WHERE aggregate_sequence = 2`).Scan(&attempts, &published); err != nil {
			t.Fatal(err)
		}
		if attempts != 0 || published != nil {
			t.Errorf("%s: the event has %d attempts, published at %v; want none spent, not published", name, attempts, published)
		}
	}
}
