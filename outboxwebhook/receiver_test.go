package outboxwebhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestSignatureVector: the signature of the Standard Webhooks
// specification's test vector.
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
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1a,bm90IGEgc2lnbmF0dXJl "+sig)
	if err := outboxwebhook.Verify([]string{secret}, h, body, 0, ts.Add(4*time.Minute)); err != nil {
		t.Fatalf("verify the test vector: %v", err)
	}
	if err := outboxwebhook.Verify([]string{secret}, h, body, 0, ts.Add(6*time.Minute)); !errors.Is(err, outboxwebhook.ErrTimestamp) {
		t.Fatalf("verify 6 minutes later: %v, want ErrTimestamp", err)
	}
	if err := outboxwebhook.Verify([]string{secret}, h, []byte(`{"test": 2432232315}`), 0, ts); !errors.Is(err, outboxwebhook.ErrBadSignature) {
		t.Fatalf("verify another body: %v, want ErrBadSignature", err)
	}
}

// signedRequest builds a request as a Publisher would, with a chosen
// timestamp and body.
func signedRequest(t *testing.T, url string, secrets []string, m outbox.Message, ts time.Time, body []byte) *http.Request {
	t.Helper()
	var captured http.Header
	cap := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { captured = r.Header.Clone() }))
	defer cap.Close()
	p := publisher(t, outboxwebhook.Config{URL: cap.URL, Secrets: secrets})
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = captured
	id := captured.Get("webhook-id")
	sig, err := outboxwebhook.Sign(secrets, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	return req
}

// TestReceiverRefuses: the receiver answers 401 for a tampered body, a
// wrong secret or a timestamp out of tolerance, 413 for a body over the
// limit, 400 for a request that is not an outbox event, 405 for other
// methods, and passes handle's verdict on: 500 to retry, 422 for a
// permanent error, 204 when handled.
func TestReceiverRefuses(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	var handleErr error
	handled := 0
	rc, err := outboxwebhook.NewReceiver([]string{secret}, func(ctx context.Context, m outbox.Message) error {
		handled++
		return handleErr
	}, outboxwebhook.ReceiverOptions{MaxBodyBytes: 100})
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
	good := func() *http.Request { return signedRequest(t, srv.URL, []string{secret}, m, now, m.Payload) }
	if code := do(good()); code != http.StatusNoContent || handled != 1 {
		t.Fatalf("a good request: %d (handled %d)", code, handled)
	}
	tampered := good()
	tampered.Body = io.NopCloser(strings.NewReader(`{"n":2}`))
	tampered.ContentLength = 7
	wrong := signedRequest(t, srv.URL, []string{newSecret(t)}, m, now, m.Payload)
	stale := signedRequest(t, srv.URL, []string{secret}, m, now.Add(-6*time.Minute), m.Payload)
	future := signedRequest(t, srv.URL, []string{secret}, m, now.Add(6*time.Minute), m.Payload)
	unsigned := good()
	unsigned.Header.Del("webhook-signature")
	big := bytes.Repeat([]byte("x"), 101)
	tooBig := signedRequest(t, srv.URL, []string{secret}, m, now, big)
	notEvent := good()
	notEvent.Header.Del("ce-sequence")
	get, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	for name, tc := range map[string]struct {
		req  *http.Request
		code int
	}{
		"tampered body": {tampered, 401}, "wrong secret": {wrong, 401}, "stale timestamp": {stale, 401},
		"future timestamp": {future, 401}, "unsigned": {unsigned, 401}, "too big": {tooBig, 413},
		"not an event": {notEvent, 400}, "GET": {get, 405},
	} {
		if code := do(tc.req); code != tc.code {
			t.Errorf("%s: %d, want %d", name, code, tc.code)
		}
	}
	if handled != 1 {
		t.Fatalf("handle ran %d times, want once", handled)
	}
	handleErr = errors.New("database down")
	if code := do(good()); code != http.StatusInternalServerError {
		t.Errorf("handle failed: %d, want 500", code)
	}
	handleErr = outbox.Permanent(errors.New("cannot apply"))
	if code := do(good()); code != http.StatusUnprocessableEntity {
		t.Errorf("handle failed permanently: %d, want 422", code)
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
