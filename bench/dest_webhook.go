package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net"
	"net/http"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// openWebhook starts an in-process HTTP receiver on a loopback port of its
// own (outboxwebhook.Receiver: it verifies each request's Standard Webhooks
// signature, decodes the event, notes it for the I5 check and answers 204)
// and returns an outboxwebhook publisher to it, signing with a fresh
// random secret.
func openWebhook(ctx context.Context, e *env, s space) (*target, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	secrets := []string{"whsec_" + base64.StdEncoding.EncodeToString(key)}
	oc := newOrderCheck()
	rc, err := outboxwebhook.NewReceiver(secrets, func(_ context.Context, m outbox.Message) error {
		_ = oc.add(m, "the receiver") // the naive publisher is out of order: only our relay's drains are checked
		return nil
	}, outboxwebhook.ReceiverOptions{})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: rc}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	stop := func() {
		_ = srv.Close()
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.logf("webhook receiver: %v", err)
		}
	}
	pub, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: "http://" + ln.Addr().String() + "/events", Secrets: secrets})
	if err != nil {
		stop()
		return nil, err
	}
	if err := pub.Probe(ctx); err != nil {
		stop()
		return nil, err
	}
	return &target{pub: pub, close: func() { pub.Close(); stop() },
		check: func(context.Context, int) (int, error) { return oc.result() }}, nil
}
