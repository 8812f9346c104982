package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// errNotApplied is the error a webhook answer carries for an event the
// inbox did not apply (yet): the relay posts it again after Retry-After.
var errNotApplied = errors.New("inventory: event not applied")

// WebhookHandler returns the http.Handler that receives the relay's POSTs
// (outboxwebhook's signed requests; secrets are the "whsec_" signing
// secrets, as in OUTBOX_WEBHOOK_SECRET) and hands each event to the inbox
// like every transport. Its answers tell the relay what to do:
//
//   - 204: the event was applied now, or before (a duplicate: the relay
//     retried after a lost answer, answered by the receiver from its memory
//     of handled deliveries or, after a restart, by the inbox); the relay
//     marks it published.
//   - 500 with a short Retry-After: an earlier event of the order is not
//     applied yet (Early), or applying it failed; the relay posts it again
//     after that delay. A 500 spends one of the event's attempts. A 503
//     would spend none, but tells the relay the whole endpoint is down (it
//     backs off every event and reports itself not ready), while this is
//     one event's matter; and since the relay posts an order's next event
//     only after this one's 2xx, Early means something upstream went wrong
//     (an event skipped or quarantined), which the event's attempts then
//     bring to an operator's attention through quarantine rather than
//     retrying it forever.
//   - 500 without an inbox transaction: the failpoint
//     "consumer/after-commit-before-ack" dropped the answer after the
//     commit, as a crash there would; the retry is a duplicate.
//   - 401 (bad signature, unsigned attributes, a webhook-id that is not the
//     event's), 400 (not an outbox event), as NewReceiver does.
func (c *Consumer) WebhookHandler(secrets []string) (http.Handler, error) {
	return outboxwebhook.NewReceiver(secrets, func(ctx context.Context, msg outbox.Message) error {
		c.delivered.Add(1)
		// A request carries no delivery count: each is taken as a first
		// delivery (a short Retry-After), and the relay's own backoff
		// lengthens the pauses of an event that keeps failing.
		switch v, d := c.deliver(ctx, msg, 1); v {
		case settle:
			return nil
		case dropAck:
			return fmt.Errorf("%w: answer dropped after the commit (failpoint)", errNotApplied)
		default:
			return outbox.RetryAfter(fmt.Errorf("%w: not applied yet (an earlier event of order %s is missing, or it failed); try again later",
				errNotApplied, msg.AggregateID), d)
		}
	}, outboxwebhook.ReceiverOptions{TracerProvider: c.cfg.TracerProvider})
}

// RunWebhook serves the relay's POSTs to destinationURL: it listens on the
// URL's host and port, serves its path with WebhookHandler (404 elsewhere)
// until ctx ends, then shuts the server down gracefully (the requests in
// progress finish within AckWait) and returns nil. secrets are the signing
// secrets; none is an error that does not repeat them.
//
// A webhook has one endpoint, so one consumer process serves it (several
// would need a load balancer in front).
func (c *Consumer) RunWebhook(ctx context.Context, destinationURL string, secrets []string) error {
	cfg, err := outboxwebhook.ParseURL(destinationURL)
	if err != nil {
		return err
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return err
	}
	if u.Scheme != "http" {
		return fmt.Errorf("inventory: serving %s://: only http:// is served here (put a TLS-terminating proxy in front)", u.Scheme)
	}
	h, err := c.WebhookHandler(secrets)
	if err != nil {
		return fmt.Errorf("inventory: %w (set %s)", err, outboxwebhook.EnvSecret)
	}
	path := u.Path
	if path == "" {
		path = "/"
	}
	mux := http.NewServeMux()
	mux.Handle(path, h)
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("inventory: listen on %s: %w", addr, err)
	}
	return c.serveWebhook(ctx, ln, mux, path)
}

func (c *Consumer) serveWebhook(ctx context.Context, ln net.Listener, h http.Handler, path string) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	c.log.Info("inventory consumer starting", slog.String("listen", ln.Addr().String()), slog.String("path", path))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("inventory: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.AckWait+time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-done
	c.log.Info("inventory consumer stopped", slog.Any("stats", c.Stats()))
	if err != nil {
		return fmt.Errorf("inventory: shutdown: %w", err)
	}
	return nil
}
