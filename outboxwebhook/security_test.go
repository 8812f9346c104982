package outboxwebhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// captured is a request as it went over the wire.
type captured struct {
	header http.Header
	body   []byte
}

// resend sends a copy of c, changed by edit, to url and returns the answer's
// status.
func (c captured) resend(t *testing.T, url string, edit func(h http.Header, body []byte) []byte) int {
	t.Helper()
	h, body := c.header.Clone(), bytes.Clone(c.body)
	if edit != nil {
		body = edit(h, body)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// tap is a receiver behind a proxy that keeps a copy of every request, as
// a TLS-terminating proxy, a plain-HTTP hop or a log could.
type tap struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []captured
}

func newTap(t *testing.T, h http.Handler) *tap {
	tp := &tap{}
	tp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tp.mu.Lock()
		tp.got = append(tp.got, captured{header: r.Header.Clone(), body: body})
		tp.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(tp.srv.Close)
	return tp
}

func (tp *tap) last() captured {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.got[len(tp.got)-1]
}

// modes are the publisher configurations the security tests run with: the
// default (structured) and binary mode.
var modes = []struct {
	name string
	mode outboxwebhook.Mode
}{{"default", ""}, {"binary", outboxwebhook.Binary}}

// TestForgedAttributesRefused: a captured request re-sent within the
// tolerance as another event (the next event's id, sequence and type in
// place of its own) is refused, whichever way the attributes travel, and
// the genuine event, which an inbox would otherwise drop as a duplicate,
// is applied when it comes.
func TestForgedAttributesRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			pool, schema := outboxtest.Schema(t)
			in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			type effect struct {
				typ     string
				payload string
			}
			var mu sync.Mutex
			applied := map[uuid.UUID]effect{}
			secret := newSecret(t)
			rc, err := outboxwebhook.NewReceiver([]string{secret}, func(ctx context.Context, m outbox.Message) error {
				outcome, err := in.Handle(ctx, m, func(context.Context, pgx.Tx) error {
					mu.Lock()
					defer mu.Unlock()
					applied[m.ID] = effect{m.Type, string(m.Payload)}
					return nil
				})
				if err == nil && outcome == inbox.Early {
					err = errors.New("early")
				}
				return err
			}, outboxwebhook.ReceiverOptions{Mode: mode.mode})
			if err != nil {
				t.Fatal(err)
			}
			tp := newTap(t, rc)
			p := publisher(t, outboxwebhook.Config{URL: tp.srv.URL, Secrets: []string{secret}, Mode: mode.mode})

			placed := message("o-1", 1)
			placed.Type, placed.Payload = "OrderPlaced", []byte(`{"total":1299}`)
			cancelled := message("o-1", 2)
			cancelled.Type, cancelled.Payload = "OrderCancelled", []byte(`{"reason":"customer"}`)
			if err := publishOne(t, p, placed); err != nil {
				t.Fatal(err)
			}
			capt := tp.last()

			// The attacker rewrites what says which event this is: in the
			// ce- headers, in the JSON body, or both.
			asCancelled := func(h http.Header, body []byte) []byte {
				for k, v := range map[string]string{"ce-id": cancelled.ID.String(), "ce-sequence": "00000000000000000002", "ce-type": "OrderCancelled"} {
					h.Set(k, v)
				}
				body = bytes.Replace(body, []byte(placed.ID.String()), []byte(cancelled.ID.String()), 1)
				body = bytes.Replace(body, []byte(`"00000000000000000001"`), []byte(`"00000000000000000002"`), 1)
				return bytes.Replace(body, []byte(`"OrderPlaced"`), []byte(`"OrderCancelled"`), 1)
			}
			withWebhookID := func(h http.Header, body []byte) []byte {
				h.Set("webhook-id", cancelled.ID.String())
				h.Set("idempotency-key", cancelled.ID.String())
				return asCancelled(h, body)
			}
			for name, edit := range map[string]func(http.Header, []byte) []byte{"attributes": asCancelled, "attributes and webhook-id": withWebhookID} {
				if code := capt.resend(t, tp.srv.URL, edit); code != http.StatusUnauthorized && code != http.StatusConflict {
					t.Errorf("the captured request re-sent with its %s changed to another event's: %d, want 401 or 409", name, code)
				}
			}
			mu.Lock()
			_, forged := applied[cancelled.ID]
			mu.Unlock()
			if forged {
				t.Errorf("a forged request was applied as event %s", cancelled.ID)
			}

			if err := publishOne(t, p, cancelled); err != nil {
				t.Fatalf("the genuine event after the forgeries: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			want := map[uuid.UUID]effect{placed.ID: {"OrderPlaced", `{"total":1299}`}, cancelled.ID: {"OrderCancelled", `{"reason":"customer"}`}}
			if len(applied) != len(want) || applied[placed.ID] != want[placed.ID] || applied[cancelled.ID] != want[cancelled.ID] {
				t.Fatalf("applied %v, want %v", applied, want)
			}
			_ = ctx
		})
	}
}

// TestReplayedRequestAcceptedOnce: a copy of a request the receiver
// answered 2xx, sent again within the tolerance (a replay of a captured
// request, or the relay's retry after a lost answer, with a new
// timestamp), is answered 204 without handle running again; a copy of a
// request handle failed reaches handle again (it is a retry); another
// Receiver (a restart) has no memory of it.
func TestReplayedRequestAcceptedOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			secret := newSecret(t)
			var mu sync.Mutex
			calls := map[uuid.UUID]int{}
			var fail error
			handle := func(_ context.Context, m outbox.Message) error {
				mu.Lock()
				defer mu.Unlock()
				calls[m.ID]++
				return fail
			}
			rc, err := outboxwebhook.NewReceiver([]string{secret}, handle, outboxwebhook.ReceiverOptions{Mode: mode.mode})
			if err != nil {
				t.Fatal(err)
			}
			tp := newTap(t, rc)
			p := publisher(t, outboxwebhook.Config{URL: tp.srv.URL, Secrets: []string{secret}, Mode: mode.mode})
			m := message("o-1", 1)
			if err := publishOne(t, p, m); err != nil {
				t.Fatal(err)
			}
			capt := tp.last()
			if code := capt.resend(t, tp.srv.URL, nil); code != http.StatusNoContent {
				t.Errorf("the exact request again: %d, want 204", code)
			}
			if err := publishOne(t, p, m); err != nil {
				t.Errorf("the relay's retry: %v", err)
			}
			mu.Lock()
			if calls[m.ID] != 1 {
				t.Errorf("handle ran %d times for one event sent three times, want once", calls[m.ID])
			}
			mu.Unlock()

			// A failed delivery is not remembered: its copy is a retry.
			failed := message("o-2", 1)
			mu.Lock()
			fail = errors.New("database down")
			mu.Unlock()
			if err := publishOne(t, p, failed); err == nil {
				t.Fatal("a failing handle was accepted")
			}
			mu.Lock()
			fail = nil
			mu.Unlock()
			if code := tp.last().resend(t, tp.srv.URL, nil); code != http.StatusNoContent {
				t.Errorf("a copy of a failed request: %d, want 204 (handled now)", code)
			}
			mu.Lock()
			if calls[failed.ID] != 2 {
				t.Errorf("handle ran %d times for a failed request and its copy, want twice", calls[failed.ID])
			}
			mu.Unlock()

			// A restarted receiver remembers nothing.
			again, err := outboxwebhook.NewReceiver([]string{secret}, handle, outboxwebhook.ReceiverOptions{Mode: mode.mode})
			if err != nil {
				t.Fatal(err)
			}
			restarted := httptest.NewServer(again)
			defer restarted.Close()
			if code := capt.resend(t, restarted.URL, nil); code != http.StatusNoContent {
				t.Errorf("the exact request to a restarted receiver: %d", code)
			}
			mu.Lock()
			defer mu.Unlock()
			if calls[m.ID] != 2 {
				t.Errorf("handle ran %d times after a restart, want twice (the memory is per process)", calls[m.ID])
			}
		})
	}
}

// TestStructuredModeIsDefault: a publisher without a mode sends one
// application/cloudevents+json body with every attribute, the JSON payload
// as "data" byte for byte, and no ce- header; a binary payload goes as
// data_base64.
func TestStructuredModeIsDefault(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	s := newSink(t, secret)
	tp := newTap(t, s.srv.Config.Handler)
	p := publisher(t, outboxwebhook.Config{URL: tp.srv.URL, Secrets: []string{secret}})
	j := message("o-1", 1)
	j.Payload = []byte(`{"b": [1, 2.50, "\u00e9"],  "a":null}`) // spacing and escapes a re-encoding would change
	j.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	if err := publishOne(t, p, j); err != nil {
		t.Fatal(err)
	}
	c := tp.last()
	if ct := c.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/cloudevents+json") {
		t.Fatalf("Content-Type %q, want application/cloudevents+json", ct)
	}
	for k := range c.header {
		if strings.HasPrefix(strings.ToLower(k), "ce-") {
			t.Errorf("structured mode sends header %s", k)
		}
	}
	if !bytes.Contains(c.body, []byte(`"data":`+string(j.Payload)+`}`)) {
		t.Errorf("the JSON payload is not in data byte for byte:\n%s", c.body)
	}
	for _, attr := range []string{`"id":"` + j.ID.String() + `"`, `"type":"OrderCreated"`, `"subject":"o-1"`, `"aggregatetype":"order"`, `"sequence":"00000000000000000001"`, `"specversion":"1.0"`} {
		if !bytes.Contains(c.body, []byte(attr)) {
			t.Errorf("the body lacks %s:\n%s", attr, c.body)
		}
	}
	if c.header.Get("traceparent") != j.Headers["traceparent"] {
		t.Errorf("traceparent is not copied to the HTTP headers for middleware: %v", c.header)
	}
	got := s.messages()
	if len(got) != 1 || !bytes.Equal(got[0].Payload, j.Payload) || got[0].Headers["traceparent"] != j.Headers["traceparent"] {
		t.Fatalf("received %+v", got)
	}

	for _, tc := range []struct {
		ct      string
		payload []byte
	}{
		{"application/protobuf", []byte{0, 1, 2, 0xff}},
		{"application/json", []byte("{\"a\":1}\n")}, // trailing white space: kept by base64
		{"application/json", []byte(`not json`)},
		{"text/plain", []byte("héllo")},
		{"application/json", []byte{'"', 0xff, '"'}}, // not UTF-8
	} {
		m := message("o-2", 1)
		m.ContentType, m.Payload = tc.ct, tc.payload
		if err := publishOne(t, p, m); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(tp.last().body, []byte(`"data_base64":`)) {
			t.Errorf("%s payload %q not sent as data_base64:\n%s", tc.ct, tc.payload, tp.last().body)
		}
		got := s.messages()
		if last := got[len(got)-1]; !bytes.Equal(last.Payload, tc.payload) || last.ContentType != tc.ct {
			t.Errorf("%s payload %q came back as %s %q", tc.ct, tc.payload, last.ContentType, last.Payload)
		}
	}
}
