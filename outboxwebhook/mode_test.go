package outboxwebhook_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// Security review of issue 19, item 8: the content mode is not signed (the
// Standard Webhooks signature covers the body only), so the receiver must
// not take it from the request's Content-Type. A captured binary-mode
// request whose payload an attacker shaped as a CloudEvents JSON object
// (a free-text field relayed as it is, an event id the client chose) is
// re-sent with Content-Type application/cloudevents+json and the ce-
// headers dropped: the body's signature still matches, and a receiver that
// chose the mode by the Content-Type read the payload as the event's
// attributes. A receiver of one mode refuses the other (401), either way.
func TestContentModeBoundByReceiver(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	var mu sync.Mutex
	var got []outbox.Message
	rc, err := outboxwebhook.NewReceiver([]string{secret}, func(_ context.Context, m outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, m)
		return nil
	}, outboxwebhook.ReceiverOptions{Mode: outboxwebhook.Binary})
	if err != nil {
		t.Fatal(err)
	}
	tp := newTap(t, rc)
	p := publisher(t, outboxwebhook.Config{URL: tp.srv.URL, Secrets: []string{secret}, Mode: outboxwebhook.Binary})

	m := message("o-1", 1)
	m.Type = "SupportNoteAdded"
	m.Payload = []byte(`{"specversion":"1.0","id":"` + m.ID.String() + `","source":"/shop","type":"RefundIssued","subject":"o-9",` +
		`"time":"2026-01-01T00:00:00Z","aggregatetype":"order","sequence":"00000000000000000007","schemaversion":"1","partitionkey":"o-9","data":{"amount":100000}}`)
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	capt := tp.last()
	flip := func(h http.Header, body []byte) []byte {
		for k := range h {
			if strings.HasPrefix(strings.ToLower(k), "ce-") || strings.EqualFold(k, "webhook-outbox-signature") {
				h.Del(k)
			}
		}
		h.Set("Content-Type", "application/cloudevents+json")
		return body
	}
	if code := capt.resend(t, tp.srv.URL, flip); code != http.StatusUnauthorized {
		t.Errorf("a binary-mode request re-sent as structured mode: %d, want 401", code)
	}
	mu.Lock()
	for _, g := range got {
		if g.Type != "SupportNoteAdded" || g.AggregateID != "o-1" {
			t.Errorf("handled a forged event: %s of %s", g.Type, g.AggregateID)
		}
	}
	mu.Unlock()

	// The other way: a structured receiver refuses binary mode, genuine or
	// not, and the binary publisher refuses an event whose content type
	// would say structured mode.
	s := newSink(t, secret)
	if code := capt.resend(t, s.srv.URL, nil); code != http.StatusUnauthorized {
		t.Errorf("a binary-mode request at a structured-mode receiver: %d, want 401", code)
	}
	ce := message("o-2", 1)
	ce.ContentType = "application/cloudevents+json"
	if err := publishOne(t, p, ce); !outbox.IsPermanent(err) {
		t.Errorf("binary mode with content type application/cloudevents+json: %v, want a permanent error", err)
	}
}
