package destinationtest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/destinationtest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestWebhook runs the suite on HTTP webhooks, in the default structured
// mode (the attributes are members of the JSON body) and in binary mode
// (ce- headers): the destination is a verifying receiver
// (outboxwebhook.NewReceiver) on a local port that keeps what it accepted;
// the restart closes its server and opens another on the same port, the
// store kept, as a receiver with a database would.
func TestWebhook(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode   outboxwebhook.Mode
		prefix string
	}{{outboxwebhook.Structured, ""}, {outboxwebhook.Binary, "ce-"}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			open := func(t *testing.T) destinationtest.Target { return webhookTarget(t, tc.mode) }
			destinationtest.Run(t, destinationtest.Destination{
				AttributePrefix: tc.prefix,
				DedupKey:        true, // Idempotency-Key and webhook-id
				Open:            open,
				OpenRestartable: open,
			})
		})
	}
}

// endpoint is a receiver that records every request it accepted (2xx).
type endpoint struct {
	mu       sync.Mutex
	accepted []destinationtest.Delivery
	arrived  chan struct{} // closed and replaced on every acceptance

	addr string
	srv  *http.Server
	h    http.Handler
}

// refusedType is the event type the endpoint answers 422 for.
const refusedType = "RefusedByTheEndpoint"

func webhookTarget(t *testing.T, mode outboxwebhook.Mode) destinationtest.Target {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	secrets := []string{"whsec_" + base64.StdEncoding.EncodeToString(secret)}
	e := &endpoint{arrived: make(chan struct{})}
	rc, err := outboxwebhook.NewReceiver(secrets, func(ctx context.Context, m outbox.Message) error {
		if m.Type == refusedType {
			return outbox.Permanent(errors.New("this endpoint does not take that event type"))
		}
		return nil
	}, outboxwebhook.ReceiverOptions{Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	e.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rw := &statusWriter{ResponseWriter: w}
		rc.ServeHTTP(rw, r)
		if rw.status/100 != 2 {
			return
		}
		// Accepted: a first delivery, or a copy the receiver remembered
		// (answered 204 without handling it again); both are deliveries.
		m, err := outboxwebhook.Decode(r.Header, body)
		if err != nil {
			t.Errorf("the receiver accepted a request Decode refuses: %v", err)
			return
		}
		attrs := map[string]string{}
		for k, v := range r.Header {
			attrs[strings.ToLower(k)] = v[0]
		}
		if mode == outboxwebhook.Structured {
			var members map[string]any
			if err := json.Unmarshal(body, &members); err != nil {
				t.Errorf("a structured-mode body is not a JSON object: %v", err)
				return
			}
			for k, v := range members {
				if s, ok := v.(string); ok {
					attrs[k] = s
				}
			}
		}
		e.mu.Lock()
		e.accepted = append(e.accepted, destinationtest.Delivery{Message: m, Attributes: attrs, Key: r.Header.Get("Idempotency-Key")})
		close(e.arrived)
		e.arrived = make(chan struct{})
		e.mu.Unlock()
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	e.serve(l)
	t.Cleanup(func() { e.srv.Close() })
	p, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: "http://" + e.addr + "/events", Secrets: secrets, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	return destinationtest.Target{
		Publisher: p,
		Read:      e.read,
		Unreachable: func(t *testing.T) outbox.Publisher {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			free := l.Addr().String()
			l.Close()
			p, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: "http://" + free + "/events", Secrets: secrets, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		Refuse: func(m outbox.Message) outbox.Message {
			m.Type = refusedType
			return m
		},
		Restart: func(t *testing.T) {
			e.srv.Close()
			time.Sleep(300 * time.Millisecond) // down for a moment, as a restarting receiver is
			var l net.Listener
			for {
				if l, err = net.Listen("tcp", e.addr); err == nil {
					break
				}
				time.Sleep(10 * time.Millisecond) // the port is being released
			}
			e.serve(l)
		},
	}
}

func (e *endpoint) serve(l net.Listener) {
	e.srv = &http.Server{Handler: e.h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(l) }()
}

func (e *endpoint) read(ctx context.Context, n int) ([]destinationtest.Delivery, error) {
	for {
		e.mu.Lock()
		got, arrived := append([]destinationtest.Delivery(nil), e.accepted...), e.arrived
		e.mu.Unlock()
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-arrived:
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
