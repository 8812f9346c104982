package inventory_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/internal/testcert"
)

// TestAMQPConsumerOverTLS: Run with an amqps:// destination URL carrying
// ca_file, cert_file and key_file, the URL the relay takes, reaches the
// broker through a TLS proxy that requires a client certificate, and
// applies every event.
func TestAMQPConsumerOverTLS(t *testing.T) {
	t.Parallel()
	e := newAMQPEnv(t, rabbittest.URL())
	ca := testcert.NewCA(t, "mq")
	client := ca.Client(t, "client", "inventory")
	plain, err := url.Parse(rabbittest.URL())
	if err != nil {
		t.Fatal(err)
	}
	secure := *plain
	secure.Scheme, secure.Host = "amqps", testcert.Proxy(t, ca.ServerConfig(t, ca.Server(t, "server")), plain.Host)
	q := url.Values{"exchange": {e.exchange}, "ca_file": {ca.CertFile}, "cert_file": {client.CertFile}, "key_file": {client.KeyFile}}
	secure.RawQuery = q.Encode()

	waves, want := orders(10)
	e.publishAMQP(waves[0]...)
	e.publishAMQP(waves[1]...)
	c := e.consumer()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, secure.String()) }()
	total := int64(len(waves[0]) + len(waves[1]))
	e.waitStats("every event applied over TLS", func(s inventory.Stats) bool { return s.Applied == total })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	e.checkStock(want)
}
