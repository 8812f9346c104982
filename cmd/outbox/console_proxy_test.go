package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestConsoleCommandProxyIdentity: `outbox console --auth-proxy-header`
// refuses a token beside it and wants --trusted-proxy (and the other way
// round); with both it serves beyond loopback without a token, and the
// header is the operator on requests from a trusted proxy (here the
// loopback address, from env OUTBOX_CONSOLE_TRUSTED_PROXIES), refused
// from any other.
func TestConsoleCommandProxyIdentity(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	const header, token = "X-Forwarded-Email", "tok-console-proxy-4b7d0e91c2"
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{[]string{"OUTBOX_CONSOLE_TOKEN=" + token}, []string{"--auth-proxy-header", header, "--trusted-proxy", "127.0.0.1"}, 1, "exclusive"},
		{[]string{"OUTBOX_CONSOLE_TOKEN="}, []string{"--auth-proxy-header", header}, 2, "needs --trusted-proxy"},
		{[]string{"OUTBOX_CONSOLE_TOKEN="}, []string{"--trusted-proxy", "127.0.0.1"}, 2, "without --auth-proxy-header"},
		{[]string{"OUTBOX_CONSOLE_TOKEN="}, []string{"--auth-proxy-header", header, "--trusted-proxy", "10.0.0.1,0.0.0.0/0", "--listen", "127.0.0.1:0"}, 1, "trusts every address"},
	} {
		_, stderr, code := runOutbox(t, tc.env, append([]string{"console", "--schema", schema}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, token) {
			t.Errorf("console %v: exit %d, stderr %q; want exit %d and %q (and never the token)", tc.args, code, stderr, tc.code, tc.want)
		}
	}
	stdout, stderr, _ := runOutbox(t, nil, "console", "--help")
	for _, want := range []string{"-auth-proxy-header", "-trusted-proxy", "X-Forwarded-For"} {
		if !strings.Contains(stdout+stderr, want) {
			t.Errorf("console --help does not mention %s", want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_CONSOLE_TOKEN=", "OUTBOX_CONSOLE_TRUSTED_PROXIES=192.0.2.1, 127.0.0.1"}
	p := startConsole(t, ctx, env, "--schema", schema, "--listen", "0.0.0.0:0", "--auth-proxy-header", strings.ToLower(header))
	if !strings.Contains(p.log(), `mode="actions need the proxy's `+header+`"`) {
		t.Errorf("the start-up line does not say where the operator comes from:\n%s", p.log())
	}
	get := func(base string, h map[string]string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}
	if code, _, body := get(p.base+"quarantine", map[string]string{header: "carol@example.com"}); code != http.StatusOK || !strings.Contains(body, "carol@example.com") {
		t.Errorf("GET /quarantine from the trusted proxy for carol: %d, want 200 naming her", code)
	}
	if code, loc, _ := get(p.base, nil); code != http.StatusSeeOther || loc != "/login" {
		t.Errorf("GET / from the trusted proxy without the header: %d to %q, want 303 to /login", code, loc)
	}

	elsewhere := startConsole(t, ctx, []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_CONSOLE_TOKEN=", "OUTBOX_CONSOLE_TRUSTED_PROXIES="},
		"--schema", schema, "--listen", "127.0.0.1:0", "--auth-proxy-header", header, "--trusted-proxy", "192.0.2.1")
	if code, _, body := get(elsewhere.base, map[string]string{header: "carol@example.com", "X-Forwarded-For": "192.0.2.1"}); code != http.StatusForbidden || strings.Contains(body, "carol") {
		t.Errorf("GET / with the header from an untrusted address: %d, want 403", code)
	}
	outboxtest.Eventually(t, 10*time.Second, "the refusal logged", func() bool {
		return strings.Contains(elsewhere.log(), "not a trusted proxy refused")
	})
}
