package outboxconsole_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

const proxyHeader = "X-Forwarded-Email"

// asProxy is the header map of a request the proxy forwards for name.
func asProxy(name string, more ...string) map[string]string {
	h := map[string]string{proxyHeader: name}
	for i := 0; i+1 < len(more); i += 2 {
		h[more[i]] = more[i+1]
	}
	return h
}

// TestProxyIdentityAudited: behind a trusted proxy (the test's client
// connects from 127.0.0.1, which is trusted), the header is the operator:
// the pages show them without a login, their retry and skip land in
// outbox_operations as console:proxy:<their name>, and the forms' CSRF token is
// theirs alone. A request from the proxy without the header has no
// operator: no page, no action.
func TestProxyIdentityAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 2, 3)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, AuthProxyHeader: proxyHeader, TrustedProxies: []string{"127.0.0.1", "::1"}}))
	const alice = "alice.o'neil+ops@example.com"
	code, body := c.do(http.MethodGet, "/quarantine", nil, asProxy(alice))
	if code != http.StatusOK || !strings.Contains(body, f.quarantined[0].String()) {
		t.Fatalf("GET /quarantine from the proxy for alice: %d", code)
	}
	if !strings.Contains(body, `<span class="operator">alice.o`) || !strings.Contains(body, "ops@example.com</span>") || strings.Contains(body, `action="/logout"`) {
		t.Errorf("the page does not name the operator, or offers a logout the proxy would undo:\n%s", body)
	}
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no action form on the quarantine page for the proxy's operator:\n%s", body)
	}
	csrf := m[1]
	retried, skipped := f.quarantined[0], f.quarantined[1]
	ev, err := f.admin.Event(ctx, retried)
	if err != nil {
		t.Fatal(err)
	}
	f.refuse.Delete(ev.AggregateID)

	// Refused first: no CSRF token; another operator with alice's token;
	// alice's token without the header (no operator at all).
	for _, tc := range []struct {
		name   string
		form   url.Values
		header map[string]string
		want   int
	}{
		{"no CSRF token", url.Values{"event_id": {retried.String()}}, asProxy(alice), http.StatusForbidden},
		{"another operator's header with alice's token", url.Values{"event_id": {retried.String()}, "csrf": {csrf}}, asProxy("bob@example.com"), http.StatusForbidden},
		{"no header", url.Values{"event_id": {retried.String()}, "csrf": {csrf}}, nil, http.StatusUnauthorized},
	} {
		if code, body := c.do(http.MethodPost, "/quarantine/retry", tc.form, tc.header); code != tc.want {
			t.Errorf("%s: %d, want %d (%s)", tc.name, code, tc.want, strings.TrimSpace(body))
		}
	}
	if code, body := c.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {retried.String()}, "csrf": {csrf}}, asProxy(alice)); code != http.StatusSeeOther {
		t.Fatalf("retry: %d %s", code, body)
	}
	if code, body := c.do(http.MethodPost, "/quarantine/skip", url.Values{"event_id": {skipped.String()}, "csrf": {csrf}, "reason": {"merchant will never accept EUR"}}, asProxy(alice)); code != http.StatusSeeOther {
		t.Fatalf("skip: %d %s", code, body)
	}
	checkAudit(t, f, "console:proxy:"+alice, retried, skipped, "merchant will never accept EUR")

	// From the proxy, without the header: the pages go to the login page,
	// which says where the identity comes from.
	if code, loc := c.doLocation(http.MethodGet, "/"); code != http.StatusSeeOther || loc != "/login" {
		t.Errorf("GET / from the proxy without the header: %d to %q, want 303 to /login", code, loc)
	}
	if code, body := c.get("/login"); code != http.StatusOK || !strings.Contains(body, proxyHeader) || strings.Contains(body, `name="token"`) {
		t.Errorf("the login page of a console behind a proxy: %d, does not name the header or asks for a token:\n%s", code, body)
	}
}

// doLocation is do for a GET that returns the Location header too.
func (c *client) doLocation(method, path string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.srv.URL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

// TestProxyHeaderFromUntrustedSourceRefused: when the proxy is elsewhere
// (the client connects from 127.0.0.1, which is not trusted), a request
// carrying the header is refused with 403 before any query, pages and
// actions alike, whatever it says about where it comes from
// (X-Forwarded-For, X-Real-IP and Forwarded naming the trusted proxy); and
// without the header it has no access either: the proxy is the only way
// in.
func TestProxyHeaderFromUntrustedSourceRefused(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, qc := countingPool(t)
	const proxyAddr = "192.0.2.10"
	c := newClient(t, serve(t, outboxconsole.Config{Pool: pool, Schema: schema, AuthProxyHeader: proxyHeader, TrustedProxies: []string{proxyAddr, "10.0.0.0/8"}}))
	spoofed := asProxy("alice@example.com", "X-Forwarded-For", proxyAddr, "X-Real-IP", proxyAddr, "Forwarded", "for="+proxyAddr)
	before := qc.n.Load()
	for _, tc := range []struct {
		name, method, path string
		header             map[string]string
		want               int
	}{
		{"page with the header", http.MethodGet, "/", asProxy("alice@example.com"), http.StatusForbidden},
		{"page with the header and a spoofed X-Forwarded-For", http.MethodGet, "/quarantine", spoofed, http.StatusForbidden},
		{"retry with the header and a spoofed X-Forwarded-For", http.MethodPost, "/quarantine/retry", spoofed, http.StatusForbidden},
		{"the login page with the header", http.MethodGet, "/login", spoofed, http.StatusForbidden},
		{"page without the header", http.MethodGet, "/operations", nil, http.StatusSeeOther},
		{"retry without the header", http.MethodPost, "/quarantine/retry", nil, http.StatusUnauthorized},
	} {
		code, body := c.do(tc.method, tc.path, url.Values{"event_id": {"00000000-0000-0000-0000-000000000001"}}, tc.header)
		if code != tc.want {
			t.Errorf("%s: %d, want %d (%s)", tc.name, code, tc.want, strings.TrimSpace(body))
		}
		if strings.Contains(body, "alice@example.com") {
			t.Errorf("%s: the answer names the operator the client claimed", tc.name)
		}
	}
	if n := qc.n.Load() - before; n != 0 {
		t.Fatalf("%d queries ran for requests from an untrusted address; want none", n)
	}
}

// TestProxyHeaderValueChecked: from the trusted proxy, a header that is
// not a name is refused with 400 before any query: a control character (a
// tab; others Go's server refuses itself, also 400), an invisible or
// reordering character, bytes that are not UTF-8, more than
// ProxyNameMaxLength bytes, or the header twice. A name of exactly the
// longest length is taken.
func TestProxyHeaderValueChecked(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, qc := countingPool(t)
	srv := serve(t, outboxconsole.Config{Pool: pool, Schema: schema, AuthProxyHeader: proxyHeader, TrustedProxies: []string{"127.0.0.0/8"}})
	c := newClient(t, srv)
	before := qc.n.Load()
	for _, v := range []string{
		"alice\t@example.com",
		"alice\u202e@example.com",
		"ali\u200bce@example.com",
		"alice\xff@example.com",
		strings.Repeat("a", outboxconsole.ProxyNameMaxLength+1),
		strings.Repeat("a", 64<<10),
	} {
		if code, body := c.do(http.MethodGet, "/login", nil, asProxy(v)); code != http.StatusBadRequest {
			t.Errorf("header %.40q: %d, want 400 (%s)", v, code, strings.TrimSpace(body))
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/login", nil)
	req.Header.Add(proxyHeader, "alice@example.com")
	req.Header.Add(proxyHeader, "bob@example.com")
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the header twice: %d, want 400", resp.StatusCode)
	}
	// A control character the Go client will not send, written by hand.
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n" + proxyHeader + ": alice\x01@example.com\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 400 ") {
		t.Errorf("a header with \\x01: %q %v, want 400", line, err)
	}
	if n := qc.n.Load() - before; n != 0 {
		t.Fatalf("%d queries ran for requests with a bad header; want none", n)
	}
	longest := strings.Repeat("b", outboxconsole.ProxyNameMaxLength-len("@example.com")) + "@example.com"
	if code, body := c.do(http.MethodGet, "/login", nil, asProxy(longest)); code != http.StatusOK || !strings.Contains(body, longest) {
		t.Errorf("a name of %d bytes: %d, want 200 naming the operator", len(longest), code)
	}
}

// TestProxyConfigRefused: the proxy's header and its addresses go
// together, exclude the token, and trust no network of every address.
func TestProxyConfigRefused(t *testing.T) {
	t.Parallel()
	pool, _ := countingPool(t)
	for i, tc := range []struct {
		cfg  outboxconsole.Config
		want string
	}{
		{outboxconsole.Config{AuthProxyHeader: proxyHeader}, "without Config.TrustedProxies"},
		{outboxconsole.Config{TrustedProxies: []string{"10.0.0.1"}}, "without Config.AuthProxyHeader"},
		{outboxconsole.Config{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"10.0.0.1"}, Token: testToken}, "exclusive"},
		{outboxconsole.Config{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"0.0.0.0/0"}}, "trusts every address"},
		{outboxconsole.Config{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"::/0"}}, "trusts every address"},
		{outboxconsole.Config{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"::ffff:0.0.0.0/96"}}, "trusts every address"},
		{outboxconsole.Config{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"proxy.internal"}}, "not an address"},
		{outboxconsole.Config{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"10.0.0.0/33"}}, "not an address"},
		{outboxconsole.Config{AuthProxyHeader: "X Forwarded Email", TrustedProxies: []string{"10.0.0.1"}}, "not a header name"},
	} {
		tc.cfg.Pool = pool
		_, err := outboxconsole.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("case %d (header %q, proxies %q): %v, want an error saying %q", i, tc.cfg.AuthProxyHeader, tc.cfg.TrustedProxies, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), testToken) {
			t.Errorf("the error repeats the token: %v", err)
		}
	}
}
