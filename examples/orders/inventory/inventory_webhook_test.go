package inventory_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// webhookEnv is a schema of the test's own, the inventory consumer serving
// the webhook on a free port, and the relay's publisher posting to it with
// the same secret: each test is a real HTTP round trip.
type webhookEnv struct {
	*env
	url string
	pub *outboxwebhook.Publisher
}

func newSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newWebhookEnv starts the consumer with run (RunWebhook, or Run) until the
// test ends and returns once it answers.
func newWebhookEnv(t *testing.T, secret string, run func(ctx context.Context, c *inventory.Consumer, url string) error) *webhookEnv {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if err := inventory.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	c, err := inventory.New(pool, inventory.Config{Settings: inventory.Settings{Schema: schema, AckWait: 5 * time.Second,
		RetryDelay: 50 * time.Millisecond}, EarlyDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := &webhookEnv{env: &env{t: t, pool: pool, schema: schema, cons: c}, url: "http://" + freeAddr(t) + "/events"}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(rctx, c, e.url) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("consumer: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("the consumer did not return after its context ended")
		}
	})
	e.pub, err = outboxwebhook.NewPublisher(outboxwebhook.Config{URL: e.url, Secrets: []string{secret}, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pub.Close)
	outboxtest.Eventually(t, waitFor, "the consumer listening", func() bool { return e.pub.Probe(ctx) == nil })
	return e
}

func runWebhook(secret string) func(ctx context.Context, c *inventory.Consumer, url string) error {
	return func(ctx context.Context, c *inventory.Consumer, url string) error {
		return c.RunWebhook(ctx, url, []string{secret})
	}
}

// post sends one event as the relay does and returns the publisher's error.
func (e *webhookEnv) post(m outbox.Message) error {
	e.t.Helper()
	if errs := e.pub.Publish(context.Background(), []outbox.Message{m}); errs != nil {
		return errs[0]
	}
	return nil
}

// TestWebhookRepeatedPOSTAppliedOnce: the relay posts an event again (its
// first 204 was lost, say): both answers are 204 and the effect is applied
// once. The receiver answers the copy from its memory of handled
// deliveries; a receiver without that memory (a restarted consumer, or
// another instance) hands it to the inbox, which counts a duplicate.
func TestWebhookRepeatedPOSTAppliedOnce(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	e := newWebhookEnv(t, secret, runWebhook(secret))
	m := created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 4})
	for i := range 2 {
		if err := e.post(m); err != nil {
			t.Fatalf("POST %d: %v", i+1, err)
		}
	}
	if s := e.cons.Stats(); s.Delivered != 1 || s.Applied != 1 || s.Duplicates != 0 || s.Early != 0 || s.Errors != 0 {
		t.Fatalf("stats %+v; want 1 delivery, 1 applied (the copy answered by the receiver's memory)", s)
	}
	h, err := e.cons.WebhookHandler([]string{secret})
	if err != nil {
		t.Fatal(err)
	}
	restarted := httptest.NewServer(h)
	defer restarted.Close()
	p, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: restarted.URL, Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if errs := p.Publish(context.Background(), []outbox.Message{m}); errs != nil {
		t.Fatalf("POST to a fresh receiver: %v", errs[0])
	}
	if s := e.cons.Stats(); s.Delivered != 2 || s.Applied != 1 || s.Duplicates != 1 || s.Early != 0 || s.Errors != 0 {
		t.Fatalf("stats %+v; want 2 deliveries, 1 applied, 1 duplicate", s)
	}
	if got := e.reserved(); got["A"] != 4 {
		t.Fatalf("reserved %v, want A=4", got)
	}
	if n := e.processed(); n != 1 {
		t.Fatalf("%d inbox rows, want 1", n)
	}
}

// TestWebhookEarlyEventRefusedThenApplied: an order's cancellation posted
// before its creation is refused with a retryable answer and a short
// Retry-After, nothing applied; once the creation is applied, the
// cancellation posted again is applied after it.
func TestWebhookEarlyEventRefusedThenApplied(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	e := newWebhookEnv(t, secret, runWebhook(secret))
	first, second := created("o-2", 1, orderevents.Item{SKU: "B", Quantity: 3}), cancelled("o-2", 2)
	err := e.post(second)
	var se *outboxwebhook.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusInternalServerError || outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
		t.Fatalf("early event: %v; want a retryable 500", err)
	}
	if d, ok := outbox.RetryDelay(err); !ok || d < time.Second || d > 10*time.Second {
		t.Fatalf("early event: Retry-After %v (%v); want a short one", d, ok)
	}
	if s := e.cons.Stats(); s.Early != 1 || s.Applied != 0 || e.processed() != 0 || e.mark("o-2") != 0 {
		t.Fatalf("after the early event: stats %+v, %d inbox rows, mark %d; want nothing applied", s, e.processed(), e.mark("o-2"))
	}
	if err := e.post(first); err != nil {
		t.Fatalf("first event: %v", err)
	}
	if err := e.post(second); err != nil {
		t.Fatalf("early event posted again: %v", err)
	}
	if s := e.cons.Stats(); s.Applied != 2 || s.Early != 1 || s.Anomalies != 0 {
		t.Fatalf("stats %+v; want both applied", s)
	}
	if got, mark := e.reserved(), e.mark("o-2"); got["B"] != 0 || mark != 2 {
		t.Fatalf("reserved %v, mark %d; want B=0 (released) and mark 2", got, mark)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.table("inventory_reservations") + ` WHERE order_id = 'o-2' AND status = 'released'`); n != 1 {
		t.Fatalf("%d released reservations, want 1", n)
	}
}

// TestWebhookRunFromURL runs the consumer as "orders inventory
// --destination http://..." does (Run, secret in OUTBOX_WEBHOOK_SECRET): a
// request signed with another secret is refused (401: unavailable for the
// relay, which quarantines nothing over a secret) and applies nothing, the path is the URL's, and the consumer stops cleanly
// when its context ends. Not parallel: it sets the environment.
func TestWebhookRunFromURL(t *testing.T) {
	secret := newSecret(t)
	t.Setenv(outboxwebhook.EnvSecret, secret)
	e := newWebhookEnv(t, secret, func(ctx context.Context, c *inventory.Consumer, url string) error { return c.Run(ctx, url) })
	if err := e.post(created("o-3", 1, orderevents.Item{SKU: "C", Quantity: 1})); err != nil {
		t.Fatal(err)
	}
	other, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: e.url, Secrets: []string{newSecret(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	errs := other.Publish(context.Background(), []outbox.Message{created("o-4", 1, orderevents.Item{SKU: "C", Quantity: 1})})
	if errs == nil || !outbox.IsUnavailable(errs[0]) || outbox.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "401") {
		t.Fatalf("another secret: %v; want an unavailable 401", errs)
	}
	wrongPath, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: strings.TrimSuffix(e.url, "/events") + "/other", Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer wrongPath.Close()
	if errs := wrongPath.Publish(context.Background(), []outbox.Message{created("o-5", 1)}); errs == nil || !strings.Contains(errs[0].Error(), "404") {
		t.Fatalf("another path: %v; want 404", errs)
	}
	if s := e.cons.Stats(); s.Applied != 1 || e.processed() != 1 {
		t.Fatalf("stats %+v; want only the properly signed event applied", s)
	}
}

// TestWebhookNeedsASecret: without a secret the consumer does not start,
// and says where the secret goes.
func TestWebhookNeedsASecret(t *testing.T) {
	t.Setenv(outboxwebhook.EnvSecret, "")
	pool, schema := outboxtest.Schema(t)
	c, err := inventory.New(pool, inventory.Config{Settings: inventory.Settings{Schema: schema}})
	if err != nil {
		t.Fatal(err)
	}
	// Run refuses at once; the minute is only there so that a Run that
	// started without a secret ends (a loaded machine's slow refusal is
	// still a refusal, not a time-out).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx, fmt.Sprintf("http://%s/events", freeAddr(t)))
	if err == nil || !strings.Contains(err.Error(), outboxwebhook.EnvSecret) {
		t.Fatalf("Run without a secret: %v", err)
	}
}
