package outboxwebhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestSignatureVector: the signature of the Standard Webhooks
// specification's test vector, which Verify accepts for a structured-mode
// request (all of it in the body); the same request in binary mode lacks
// the signature of its attributes.
func TestSignatureVector(t *testing.T) {
	t.Parallel()
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	id, ts, body := "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`)
	sig, err := outboxwebhook.Sign([]string{secret}, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; sig != want {
		t.Fatalf("signature %q, want %q", sig, want)
	}
	h := http.Header{}
	h.Set("content-type", "application/cloudevents+json; charset=utf-8")
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1a,bm90IGEgc2lnbmF0dXJl "+sig)
	if err := outboxwebhook.Verify([]string{secret}, "", h, body, 0, ts.Add(4*time.Minute)); err != nil {
		t.Fatalf("verify the test vector: %v", err)
	}
	if err := outboxwebhook.Verify([]string{secret}, "", h, body, 0, ts.Add(6*time.Minute)); !errors.Is(err, outboxwebhook.ErrTimestamp) {
		t.Fatalf("verify 6 minutes later: %v, want ErrTimestamp", err)
	}
	if err := outboxwebhook.Verify([]string{secret}, "", h, []byte(`{"test": 2432232315}`), 0, ts); !errors.Is(err, outboxwebhook.ErrBadSignature) {
		t.Fatalf("verify another body: %v, want ErrBadSignature", err)
	}
	if err := outboxwebhook.Verify([]string{secret}, outboxwebhook.Binary, h, body, 0, ts); !errors.Is(err, outboxwebhook.ErrModeMismatch) {
		t.Fatalf("verify a structured-mode request for binary mode: %v, want ErrModeMismatch", err)
	}
	h.Set("content-type", "application/json")
	if err := outboxwebhook.Verify([]string{secret}, outboxwebhook.Binary, h, body, 0, ts); !errors.Is(err, outboxwebhook.ErrUnsignedAttributes) {
		t.Fatalf("verify in binary mode without webhook-outbox-signature: %v, want ErrUnsignedAttributes", err)
	}
	if err := outboxwebhook.Verify([]string{secret}, "", h, body, 0, ts); !errors.Is(err, outboxwebhook.ErrModeMismatch) {
		t.Fatalf("verify a binary-mode request for structured mode: %v, want ErrModeMismatch", err)
	}
	h.Add("webhook-id", "msg_other")
	if err := outboxwebhook.Verify([]string{secret}, "", h, body, 0, ts); !errors.Is(err, outboxwebhook.ErrNoSignature) {
		t.Fatalf("verify with two webhook-ids: %v, want ErrNoSignature", err)
	}
}

// signedRequest builds a request as a Publisher in mode would send m at
// ts, changed by edit (nil: none) and signed again after the change.
func signedRequest(t *testing.T, url string, secrets []string, mode outboxwebhook.Mode, m outbox.Message, ts time.Time, edit func(h http.Header, body []byte) []byte) *http.Request {
	t.Helper()
	var c captured
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c = captured{header: r.Header.Clone(), body: body}
	}))
	defer srv.Close()
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: secrets, Mode: mode})
	outboxwebhook.SetClock(p, func() time.Time { return ts })
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		c.body = edit(c.header, c.body)
		if err := outboxwebhook.SignRequest(secrets, c.header, ts, c.body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = c.header
	return req
}

// TestReceiverRefuses: in either mode the receiver answers 401 for a
// tampered body, a wrong secret, a timestamp out of tolerance, unsigned
// attributes or a webhook-id that is not the event's, 413 for a body over
// the limit, 400 for a request that is not an outbox event, 405 for other
// methods, and passes handle's verdict on: 500 to retry, 422 for a
// permanent error, 204 when handled.
func TestReceiverRefuses(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			secret := newSecret(t)
			var handleErr error
			handled := 0
			rc, err := outboxwebhook.NewReceiver([]string{secret}, func(ctx context.Context, m outbox.Message) error {
				handled++
				return handleErr
			}, outboxwebhook.ReceiverOptions{MaxBodyBytes: 1000, Remember: -1, Mode: mode.mode})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(rc)
			t.Cleanup(srv.Close)
			m := message("o-1", 1)
			now := time.Now()
			do := func(req *http.Request) int {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			req := func(edit func(h http.Header, body []byte) []byte) *http.Request {
				return signedRequest(t, srv.URL, []string{secret}, mode.mode, m, now, edit)
			}
			if code := do(req(nil)); code != http.StatusNoContent || handled != 1 {
				t.Fatalf("a good request: %d (handled %d)", code, handled)
			}
			tampered := req(nil)
			body, _ := io.ReadAll(tampered.Body)
			body = bytes.Replace(body, []byte(`{"n":1}`), []byte(`{"n":2}`), 1)
			tampered.Body, tampered.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			unsigned := req(nil)
			unsigned.Header.Del("webhook-signature")
			big := m
			big.Payload = []byte(`"` + strings.Repeat("x", 1000) + `"`)
			notEvent := func(h http.Header, body []byte) []byte {
				h.Del("ce-sequence")
				return bytes.Replace(body, []byte(`"sequence"`), []byte(`"seq"`), 1)
			}
			otherID := func(h http.Header, body []byte) []byte {
				h.Set("webhook-id", uuid.NewString())
				return body
			}
			get, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			cases := map[string]struct {
				req  *http.Request
				code int
			}{
				"tampered body": {tampered, 401}, "wrong secret": {signedRequest(t, srv.URL, []string{newSecret(t)}, mode.mode, m, now, nil), 401},
				"stale timestamp":  {signedRequest(t, srv.URL, []string{secret}, mode.mode, m, now.Add(-6*time.Minute), nil), 401},
				"future timestamp": {signedRequest(t, srv.URL, []string{secret}, mode.mode, m, now.Add(6*time.Minute), nil), 401},
				"unsigned":         {unsigned, 401}, "too big": {signedRequest(t, srv.URL, []string{secret}, mode.mode, big, now, nil), 413},
				"not an event": {req(notEvent), 400}, "another webhook-id": {req(otherID), 401}, "GET": {get, 405},
			}
			if mode.mode == outboxwebhook.Binary {
				noAttrSig := req(nil)
				noAttrSig.Header.Del("webhook-outbox-signature")
				changed := req(nil)
				changed.Header.Set("ce-type", "OrderCancelled")
				added := req(nil)
				added.Header.Set("ce-skippedfrom", "1")
				cases["attributes unsigned"] = struct {
					req  *http.Request
					code int
				}{noAttrSig, 401}
				cases["an attribute changed"] = struct {
					req  *http.Request
					code int
				}{changed, 401}
				cases["an attribute added"] = struct {
					req  *http.Request
					code int
				}{added, 401}
			}
			for name, tc := range cases {
				if code := do(tc.req); code != tc.code {
					t.Errorf("%s: %d, want %d", name, code, tc.code)
				}
			}
			if handled != 1 {
				t.Fatalf("handle ran %d times, want once", handled)
			}
			handleErr = errors.New("database down")
			if code := do(req(nil)); code != http.StatusInternalServerError {
				t.Errorf("handle failed: %d, want 500", code)
			}
			handleErr = outbox.Permanent(errors.New("cannot apply"))
			if code := do(req(nil)); code != http.StatusUnprocessableEntity {
				t.Errorf("handle failed permanently: %d, want 422", code)
			}
		})
	}
}

// TestReceiverErrorsReachTheRelay: a handle error comes back to the
// publisher retryable (500) or permanent (422), quoted; one marked with
// outbox.RetryAfter carries its delay (rounded up to seconds) to the relay.
func TestReceiverErrorsReachTheRelay(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	for _, tc := range []struct {
		err        error
		permanent  bool
		quote      string
		retryAfter time.Duration
	}{
		{errors.New("inventory db down"), false, "inventory db down", 0},
		{outbox.Permanent(errors.New("unknown sku")), true, "unknown sku", 0},
		{outbox.RetryAfter(errors.New("not yet"), 1500*time.Millisecond), false, "not yet", 2 * time.Second},
		{outbox.RetryAfter(errors.New("soon"), time.Millisecond), false, "soon", time.Second},
	} {
		rc, err := outboxwebhook.NewReceiver([]string{secret}, func(context.Context, outbox.Message) error { return tc.err }, outboxwebhook.ReceiverOptions{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(rc)
		p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}})
		err = publishOne(t, p, message("o-1", 1))
		srv.Close()
		if err == nil || outbox.IsPermanent(err) != tc.permanent || !strings.Contains(err.Error(), tc.quote) {
			t.Errorf("handle error %v: publish error %v", tc.err, err)
		}
		if d, ok := outbox.RetryDelay(err); ok != (tc.retryAfter > 0) || d != tc.retryAfter {
			t.Errorf("handle error %v: publish error's Retry-After %v (%v), want %v", tc.err, d, ok, tc.retryAfter)
		}
	}
}
