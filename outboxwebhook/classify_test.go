package outboxwebhook_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

func httpServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// TestClassifyStatus: 2xx is success; an answer about the endpoint rather
// than the event is unavailable (429 throttled, 502/503/504 down, 401/403
// not authorized, 404/405/410 not there): it must never quarantine events;
// 408, 425 and other 5xx are plain, retryable errors, all carrying
// Retry-After (also as outbox.RetryDelay, for the relay; a 429 without one
// asks for a second); the other 4xx (the endpoint refused this event) are
// permanent.
func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		code       int
		retryAfter string
		want       string // "ok", "retry", "unavailable", "permanent"
		delay      time.Duration
	}{
		{200, "", "ok", 0}, {202, "", "ok", 0}, {204, "", "ok", 0},
		{500, "7", "retry", 7 * time.Second},
		{503, "", "unavailable", 0}, {504, "3", "unavailable", 3 * time.Second},
		{502, "", "unavailable", 0}, {501, "", "retry", 0},
		{429, date, "unavailable", 90 * time.Second}, {429, "", "unavailable", 0},
		{408, "", "retry", 0}, {425, "1", "retry", time.Second},
		{401, "", "unavailable", 0}, {403, "", "unavailable", 0}, {404, "", "unavailable", 0},
		{405, "", "unavailable", 0}, {410, "", "unavailable", 0},
		{400, "", "permanent", 0}, {413, "", "permanent", 0}, {415, "", "permanent", 0}, {422, "", "permanent", 0},
	} {
		srv := httpServer(t, func(w http.ResponseWriter, r *http.Request) {
			if tc.retryAfter != "" {
				w.Header().Set("Retry-After", tc.retryAfter)
			}
			w.WriteHeader(tc.code)
			w.Write([]byte("endpoint says no")) //nolint:errcheck
		})
		p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}})
		err := publishOne(t, p, message("o-1", 1))
		switch tc.want {
		case "ok":
			if err != nil {
				t.Errorf("%d: %v", tc.code, err)
			}
			continue
		case "retry":
			if err == nil || outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
				t.Errorf("%d: %v, want a plain retryable error", tc.code, err)
				continue
			}
		case "unavailable":
			if !outbox.IsUnavailable(err) || outbox.IsPermanent(err) {
				t.Errorf("%d: %v, want unavailable", tc.code, err)
				continue
			}
		case "permanent":
			if !outbox.IsPermanent(err) {
				t.Errorf("%d: %v, want permanent", tc.code, err)
				continue
			}
		}
		var se *outboxwebhook.StatusError
		if !errors.As(err, &se) || se.StatusCode != tc.code || !strings.Contains(err.Error(), "endpoint says no") {
			t.Errorf("%d: %v, want a StatusError quoting the body", tc.code, err)
		}
		d, ok := outboxwebhook.RetryAfter(err)
		if ok != (tc.retryAfter != "") || d < tc.delay-3*time.Second || d > tc.delay {
			t.Errorf("%d: RetryAfter = %s, %v; want about %s", tc.code, d, ok, tc.delay)
		}
		wantDelay, wantOK := d, tc.retryAfter != ""
		if tc.code == http.StatusTooManyRequests && tc.retryAfter == "" {
			wantDelay, wantOK = time.Second, true
		}
		if rd, ok := outbox.RetryDelay(err); ok != wantOK || rd != wantDelay {
			t.Errorf("%d: outbox.RetryDelay = %s, %v; want %s, %v", tc.code, rd, ok, wantDelay, wantOK)
		}
	}
}

// TestRedirectNotFollowed: a 302 is an error that says so, unavailable (the
// endpoint moved, for every event: no event is to blame), and the target is
// never requested.
func TestRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	var followed atomic.Int32
	target := httpServer(t, func(w http.ResponseWriter, r *http.Request) { followed.Add(1) })
	srv := httpServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/elsewhere?token=t0ps3cret", http.StatusFound)
	})
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{newSecret(t)}})
	err := publishOne(t, p, message("o-1", 1))
	if !outbox.IsUnavailable(err) || outbox.IsPermanent(err) || !strings.Contains(err.Error(), "not followed") || !strings.Contains(err.Error(), target.URL+"/xxxxx") {
		t.Fatalf("error %v, want an unavailable redirect error naming the target, its path hidden", err)
	}
	if strings.Contains(err.Error(), "t0ps3cret") || strings.Contains(err.Error(), "elsewhere") {
		t.Fatalf("error repeats the redirect's path or query: %v", err)
	}
	if n := followed.Load(); n != 0 {
		t.Fatalf("the redirect target got %d requests", n)
	}
}

// TestResponseBodyCap: an error quotes at most about 1 KiB of a huge body,
// and reads no more than MaxResponseBytes of it.
func TestResponseBodyCap(t *testing.T) {
	t.Parallel()
	var written atomic.Int64
	srv := httpServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		chunk := []byte(strings.Repeat("x", 1024))
		for range 64 << 10 { // 64 MiB, unless the client stops reading
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{newSecret(t)}, MaxResponseBytes: 4096})
	err := publishOne(t, p, message("o-1", 1))
	if !outbox.IsPermanent(err) || !strings.Contains(err.Error(), "(truncated)") || len(err.Error()) > 1500 {
		t.Fatalf("error of %d bytes: %.300v", len(err.Error()), err)
	}
	if n := written.Load(); n > 32<<20 {
		t.Fatalf("the server wrote %d bytes: the client read the whole body", n)
	}
}

// TestUnreachable: nothing listening is outbox.Unavailable, for Publish and
// Probe; any HTTP answer makes Probe succeed.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := publisher(t, outboxwebhook.Config{URL: "http://" + addr + "/hook", Secrets: []string{newSecret(t)}})
	if err := publishOne(t, p, message("o-1", 1)); !outbox.IsUnavailable(err) {
		t.Fatalf("publish to a closed port: %v, want unavailable", err)
	}
	if err := p.Probe(testCtx(t)); !outbox.IsUnavailable(err) {
		t.Fatalf("probe a closed port: %v, want unavailable", err)
	}
	dns := publisher(t, outboxwebhook.Config{URL: "http://no-such-host.invalid/hook", Secrets: []string{newSecret(t)}})
	if err := publishOne(t, dns, message("o-1", 1)); !outbox.IsUnavailable(err) {
		t.Fatalf("publish to an unknown host: %v, want unavailable", err)
	}
	srv := httpServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusMethodNotAllowed) })
	up := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{newSecret(t)}})
	if err := up.Probe(testCtx(t)); err != nil {
		t.Fatalf("probe a server answering 405: %v", err)
	}
}

// TestTimeoutAfterSending: an endpoint that takes the request and never
// answers fails it after Config.Timeout as a plain, retryable error (it may
// have acted on it), not as unavailable.
func TestTimeoutAfterSending(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httpServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) //nolint:errcheck // then the server notices the client leaving
		select {
		case <-block:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(block) }) // before srv.Close
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{newSecret(t)}, Timeout: 200 * time.Millisecond})
	err := publishOne(t, p, message("o-1", 1))
	if err == nil || outbox.IsUnavailable(err) || outbox.IsPermanent(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want a plain deadline error", err)
	}
}

// writeCA writes the PEM of a test server's certificate (its own CA) to a
// file.
func writeCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTLSCustomCA: an https endpoint whose CA is in CAFile is trusted; the
// same endpoint without it fails the handshake, as unavailable.
func TestTLSCustomCA(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	var got atomic.Int32
	rc, err := outboxwebhook.NewReceiver([]string{secret}, func(context.Context, outbox.Message) error { got.Add(1); return nil }, outboxwebhook.ReceiverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(rc)
	t.Cleanup(srv.Close)
	cfg, err := outboxwebhook.ParseURL(srv.URL + "/hook?outbox_ca_file=" + writeCA(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Secrets = []string{secret}
	p := publisher(t, cfg)
	if err := p.Probe(testCtx(t)); err != nil {
		t.Fatalf("probe with the CA: %v", err)
	}
	if err := publishOne(t, p, message("o-1", 1)); err != nil || got.Load() != 1 {
		t.Fatalf("publish with the CA: %v (received %d)", err, got.Load())
	}
	unknown := publisher(t, outboxwebhook.Config{URL: srv.URL + "/hook", Secrets: []string{secret}})
	err = publishOne(t, unknown, message("o-1", 1))
	if !outbox.IsUnavailable(err) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("publish without the CA: %v, want an unavailable certificate error", err)
	}
	if err := unknown.Probe(testCtx(t)); !outbox.IsUnavailable(err) {
		t.Fatalf("probe without the CA: %v", err)
	}
	if _, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}, CAFile: filepath.Join(t.TempDir(), "none.pem")}); err == nil {
		t.Fatal("a missing CA file is accepted")
	}
}

// TestTLSClientCertificate: an endpoint that requires a client certificate
// accepts the publisher with CertFile and KeyFile, and fails it without.
func TestTLSClientCertificate(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox relay"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AddCert(cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	srv.TLS = &tls.Config{ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := writeCA(t, srv)
	with := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}, CAFile: ca, CertFile: certFile, KeyFile: keyFile})
	if err := publishOne(t, with, message("o-1", 1)); err != nil {
		t.Fatalf("with the client certificate: %v", err)
	}
	without := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}, CAFile: ca})
	if err := publishOne(t, without, message("o-1", 1)); err == nil {
		t.Fatal("accepted without a client certificate")
	}
}
