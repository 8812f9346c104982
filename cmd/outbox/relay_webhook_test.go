package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestRelayPublishesToWebhook runs `outbox relay --destination http://…`
// started before its endpoint: it waits, then POSTs the pending events,
// signed with OUTBOX_WEBHOOK_SECRET, to a Receiver. The endpoint answers
// 500 the first time it sees o-hook's event 2: the relay retries it and
// sends event 3 only after 2 was accepted, so the endpoint sees each
// aggregate's events in sequence order.
func TestRelayPublishesToWebhook(t *testing.T) { // not parallel: it sets the secret in the environment
	ctx := context.Background()
	key := make([]byte, 32)
	rand.Read(key) //nolint:errcheck
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	t.Setenv(outboxwebhook.EnvSecret, secret)
	pool, schema := outboxtest.Schema(t)
	for seq := int64(1); seq <= 3; seq++ {
		insertEvent(t, pool, schema, "o-hook", seq, "")
	}
	insertEvent(t, pool, schema, "o-other", 1, "")
	port := freePort(t)
	relay := startRelayProcess(t, "--schema", schema,
		"--destination", fmt.Sprintf("http://127.0.0.1:%d/hook?outbox_source=/relay-test&tenant=1", port),
		"--metrics-addr", "127.0.0.1:0", "--poll-interval", "50ms")
	addr := relay.metricsAddr(t)
	relay.waitingFor(t, addr, "destination")

	var mu sync.Mutex
	var got []outbox.Message
	refused := false
	rc, err := outboxwebhook.NewReceiver([]string{secret}, func(ctx context.Context, m outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.AggregateID == "o-hook" && m.Sequence == 2 && !refused {
			refused = true
			return errors.New("not now")
		}
		got = append(got, m)
		return nil
	}, outboxwebhook.ReceiverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listen on %d: %v", port, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && (r.URL.Path != "/hook" || r.URL.RawQuery != "tenant=1") {
			http.Error(w, "wrong URL "+r.URL.String(), http.StatusNotFound)
			return
		}
		rc.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)

	outboxtest.Eventually(t, 60*time.Second, "events published once the endpoint is up", func() bool { return allPublished(ctx, pool, schema) })
	relay.stop(t)
	mu.Lock()
	defer mu.Unlock()
	var seqs []int64
	for _, m := range got {
		if m.AggregateID == "o-hook" {
			seqs = append(seqs, m.Sequence)
		}
	}
	if fmt.Sprint(seqs) != "[1 2 3]" || len(got) != 4 || !refused {
		t.Fatalf("o-hook received in order %v (%d events in all, refused once: %v), want [1 2 3] and 4 events", seqs, len(got), refused)
	}
}
