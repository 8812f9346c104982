package outboxwebhook_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestRoundTrip: what the Receiver decodes is exactly the message
// published, with every optional field, user headers whose names differ
// only in case, and text that needs percent-encoding.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			roundTrip(t, mode.mode)
		})
	}
}

func roundTrip(t *testing.T, mode outboxwebhook.Mode) {
	secret := newSecret(t)
	s := newSinkMode(t, mode, secret)
	p := publisher(t, outboxwebhook.Config{URL: s.srv.URL + "/hook?tenant=a%20b", Secrets: []string{secret}, Source: "/shop", Mode: mode})

	plain := message("o-1", 1)
	full := message("ordre/été \"1\" 100%", 7)
	full.AggregateType = "order line"
	full.Type = "Line Added"
	full.SchemaVersion = 3
	full.ContentType = "application/protobuf"
	full.Payload = []byte{0, 1, 2, 0xff}
	full.SkippedFrom = 4
	full.ReplayID = uuid.New()
	full.OccurredAt = time.Date(2026, 5, 6, 7, 8, 9, 123456789, time.UTC)
	full.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"X-Tenant": "a, b", "x-tenant": "c", "Baggage": "k=v;é"}
	empty := message("", 2)
	empty.ContentType = "text/plain"
	empty.Payload = nil
	msgs := []outbox.Message{plain, full, empty}
	if errs := p.Publish(testCtx(t), msgs); errs != nil {
		t.Fatal(errs)
	}
	got := s.messages()
	if len(got) != len(msgs) {
		t.Fatalf("received %d messages, want %d", len(got), len(msgs))
	}
	for _, want := range msgs {
		found := false
		for _, g := range got {
			if g.ID == want.ID {
				found = true
				if g.Payload == nil {
					g.Payload = []byte{}
				}
				if want.Payload == nil {
					want.Payload = []byte{}
				}
				if !sameMessage(g, want) {
					t.Errorf("received\n%+v\nwant\n%+v", g, want)
				}
			}
		}
		if !found {
			t.Errorf("event %s not received", want.ID)
		}
	}
	for _, h := range s.raw {
		if mode == outboxwebhook.Binary && h.Get("ce-id") == full.ID.String() {
			if h.Get("ce-specversion") != "1.0" || h.Get("ce-source") != "/shop" || h.Get("ce-sequence") != "00000000000000000007" ||
				h.Get("content-type") != "application/protobuf" || h.Get("ce-replayid") != full.ReplayID.String() {
				t.Errorf("CloudEvents headers: %v", h)
			}
		}
		if strings.HasPrefix(h.Get("webhook-id"), full.ID.String()) {
			want := full.ID.String() + ":" + full.ReplayID.String()
			if h.Get("webhook-id") != want || h.Get("Idempotency-Key") != want {
				t.Errorf("a replay's webhook-id %q, Idempotency-Key %q, want %q", h.Get("webhook-id"), h.Get("Idempotency-Key"), want)
			}
		}
		if strings.HasPrefix(h.Get("webhook-id"), plain.ID.String()) && (h.Get("webhook-id") != plain.ID.String() || h.Get("Idempotency-Key") != plain.ID.String()) {
			t.Errorf("webhook-id %q, Idempotency-Key %q, want the event id", h.Get("webhook-id"), h.Get("Idempotency-Key"))
		}
	}
}

// TestRotation: with two secrets every request carries two v1 signatures,
// and a receiver that knows either one only accepts it; one that knows
// neither answers 401, which the publisher reports as unavailable (a secret
// the receiver does not know concerns every event; none is quarantined).
func TestRotation(t *testing.T) {
	t.Parallel()
	oldS, newS := newSecret(t), newSecret(t)
	for _, tc := range []struct {
		name     string
		receiver []string
		ok       bool
	}{
		{"old only", []string{oldS}, true},
		{"new only", []string{newS}, true},
		{"other", []string{newSecret(t)}, false},
	} {
		s := newSink(t, tc.receiver...)
		p := publisher(t, outboxwebhook.Config{URL: s.srv.URL, Secrets: []string{oldS, newS}})
		err := publishOne(t, p, message("o-1", 1))
		if tc.ok && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.ok && (!outbox.IsUnavailable(err) || outbox.IsPermanent(err) || !strings.Contains(err.Error(), "401")) {
			t.Errorf("%s: error %v, want an unavailable 401", tc.name, err)
		}
		if sigs := strings.Fields(s.raw[0].Get("webhook-signature")); len(sigs) != 2 || !strings.HasPrefix(sigs[0], "v1,") || !strings.HasPrefix(sigs[1], "v1,") {
			t.Errorf("%s: webhook-signature %q, want two v1 signatures", tc.name, s.raw[0].Get("webhook-signature"))
		}
	}
}

// TestRotationReceiver: a receiver that lists the old and the new secret
// accepts a sender that signs with the new one only.
func TestRotationReceiver(t *testing.T) {
	t.Parallel()
	oldS, newS := newSecret(t), newSecret(t)
	s := newSink(t, oldS, newS)
	p := publisher(t, outboxwebhook.Config{URL: s.srv.URL, Secrets: []string{newS}})
	if err := publishOne(t, p, message("o-1", 1)); err != nil {
		t.Fatal(err)
	}
}

// TestSecretsFromEnv: without Config.Secrets the publisher signs with the
// secrets of OUTBOX_WEBHOOK_SECRET.
func TestSecretsFromEnv(t *testing.T) {
	a, b := newSecret(t), newSecret(t)
	t.Setenv(outboxwebhook.EnvSecret, a+", "+b)
	s := newSink(t, b)
	p := publisher(t, outboxwebhook.Config{URL: s.srv.URL})
	if err := publishOne(t, p, message("o-1", 1)); err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(s.raw[0].Get("webhook-signature"))); n != 2 {
		t.Fatalf("%d signatures, want 2", n)
	}
	t.Setenv(outboxwebhook.EnvSecret, "")
	if _, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: s.srv.URL}); err == nil || !strings.Contains(err.Error(), "OUTBOX_WEBHOOK_SECRET") {
		t.Fatalf("no secret: %v", err)
	}
}

// TestConcurrency: one Publish call has at most Config.Concurrency
// requests in flight, and more than one.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	arrived := make(chan struct{}, 100)
	srv := httpServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		arrived <- struct{}{}
		<-release
		inFlight.Add(-1)
		w.WriteHeader(http.StatusAccepted)
	})
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}, Concurrency: 3})
	msgs := make([]outbox.Message, 20)
	for i := range msgs {
		msgs[i] = message("o-"+uuid.NewString(), 1)
	}
	done := make(chan []error)
	go func() { done <- p.Publish(testCtx(t), msgs) }()
	for range 3 {
		<-arrived
	}
	select {
	case <-arrived:
		t.Fatal("a fourth request arrived while three were in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if errs := <-done; errs != nil {
		t.Fatal(errs)
	}
	if peak.Load() != 3 {
		t.Fatalf("peak concurrency %d, want 3", peak.Load())
	}
}
