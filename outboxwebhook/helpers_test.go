package outboxwebhook_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// newSecret returns a fresh Standard Webhooks secret.
func newSecret(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func message(aggregateID string, seq int64) outbox.Message {
	return outbox.Message{
		ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: aggregateID, Sequence: seq,
		Type: "OrderCreated", SchemaVersion: 1, ContentType: outbox.ContentTypeJSON,
		Payload: []byte(`{"n":1}`), OccurredAt: time.Now().UTC(), Attempt: 1,
	}
}

// sink is a real HTTP server running a Receiver that records what it was
// handed.
type sink struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []outbox.Message
	raw []http.Header
}

func newSink(t *testing.T, secrets ...string) *sink {
	t.Helper()
	return newSinkMode(t, outboxwebhook.Structured, secrets...)
}

// newSinkMode is newSink for a receiver of the content mode given.
func newSinkMode(t *testing.T, mode outboxwebhook.Mode, secrets ...string) *sink {
	t.Helper()
	s := &sink{}
	rc, err := outboxwebhook.NewReceiver(secrets, func(ctx context.Context, m outbox.Message) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.got = append(s.got, m)
		return nil
	}, outboxwebhook.ReceiverOptions{Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.raw = append(s.raw, r.Header.Clone())
		s.mu.Unlock()
		rc.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) messages() []outbox.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]outbox.Message(nil), s.got...)
}

func publisher(t *testing.T, cfg outboxwebhook.Config) *outboxwebhook.Publisher {
	t.Helper()
	p, err := outboxwebhook.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// publishOne publishes m and returns its error.
func publishOne(t *testing.T, p *outboxwebhook.Publisher, m outbox.Message) error {
	t.Helper()
	if errs := p.Publish(testCtx(t), []outbox.Message{m}); errs != nil {
		return errs[0]
	}
	return nil
}
