package outboxconsole_test

import (
	"context"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// withHost is a header map that sends the request with another Host.
func withHost(h string) map[string]string { return map[string]string{"Host": h} }

// doHost sends a request with the Host header set to host (net/http takes
// it from req.Host, not from the header map).
func (c *client) doHost(method, path, host string, form url.Values) int {
	c.t.Helper()
	req, err := http.NewRequest(method, c.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Host = host
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+host)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestHostChecked: a request whose Host the console does not serve (a DNS
// rebinding page's own name, pointed at 127.0.0.1) is answered 421 before
// anything else, pages and POSTs alike, without a query; the loopback
// names and the configured hosts are served.
func TestHostChecked(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, qc := countingPool(t)
	for _, tc := range []struct {
		name    string
		allowed []string
		origin  string
		ok, bad []string
	}{
		{"default", nil, "", []string{"127.0.0.1:%p", "localhost:%p", "LOCALHOST:%p", "[::1]:%p"}, []string{"evil.example:%p", "evil.example", "127.0.0.2:%p"}},
		{"allow-list", []string{"outbox.example.com", "10.0.0.5:8089"}, "", []string{"outbox.example.com:%p", "outbox.example.com", "10.0.0.5:8089"}, []string{"127.0.0.1:%p", "10.0.0.5:%p", "evil.example"}},
		{"origin", nil, "https://ops.example.com", []string{"ops.example.com", "127.0.0.1:%p"}, []string{"evil.example"}},
		{"any", []string{"*"}, "", []string{"evil.example", "127.0.0.1:%p"}, nil},
	} {
		srv := serve(t, outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken, PublicRead: true, AllowedHosts: tc.allowed, Origin: tc.origin})
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
		c := newClient(t, srv)
		for _, h := range tc.ok {
			if code := c.doHost(http.MethodGet, "/login", strings.ReplaceAll(h, "%p", port), nil); code != http.StatusOK {
				t.Errorf("%s: GET with Host %q: %d, want 200", tc.name, h, code)
			}
		}
		before := qc.n.Load()
		for _, h := range tc.bad {
			for _, m := range []string{http.MethodGet, http.MethodPost} {
				path := "/"
				if m == http.MethodPost {
					path = "/login"
				}
				if code := c.doHost(m, path, strings.ReplaceAll(h, "%p", port), url.Values{"name": {"eve"}, "token": {testToken}}); code != http.StatusMisdirectedRequest {
					t.Errorf("%s: %s %s with Host %q: %d, want 421", tc.name, m, path, h, code)
				}
			}
		}
		if n := qc.n.Load() - before; n != 0 {
			t.Errorf("%s: %d queries ran for requests of another host", tc.name, n)
		}
	}
	if _, err := outboxconsole.New(outboxconsole.Config{Pool: pool, Schema: schema, AllowedHosts: []string{" "}}); err == nil {
		t.Error("an allow-list that allows nothing was accepted")
	}
}

// TestPagesNeedLogin: with a token, every page but the login page (and
// the static files) sends a visitor without a session to the login page,
// and serves them after the login; PublicRead serves them to anyone, and
// actions still need the login.
func TestPagesNeedLogin(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1, 2)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	for _, path := range []string{"/", "/quarantine", "/inbox", "/operations", "/events", "/events?event_type=PaymentCaptured",
		"/events/" + f.quarantined[0].String(), "/events/" + f.quarantined[0].String() + "/payload", "/quarantine/bulk?action=retry&error=currency"} {
		req, _ := http.NewRequest(http.MethodGet, c.srv.URL+path, nil)
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" || strings.Contains(string(body), f.quarantined[0].String()) {
			t.Errorf("GET %s without a session: %d to %q, want 303 to /login and no data", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if code, _ := c.get("/quarantine?type=payment&after=x"); code != http.StatusSeeOther {
		t.Errorf("GET a page with a query without a session: %d, want 303", code)
	}
	if code, _ := c.get("/no/such/page"); code != http.StatusUnauthorized {
		t.Errorf("GET another path without a session: %d, want 401", code)
	}
	for _, path := range []string{"/login", "/static/console.css"} {
		if code, _ := c.get(path); code != http.StatusOK {
			t.Errorf("GET %s without a session: %d, want 200", path, code)
		}
	}
	c.login("alice")
	if code, body := c.get("/quarantine"); code != http.StatusOK || !strings.Contains(body, f.quarantined[0].String()) {
		t.Fatalf("GET /quarantine logged in: %d", code)
	}

	pub := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken, PublicRead: true}))
	if code, body := pub.get("/quarantine"); code != http.StatusOK || !strings.Contains(body, f.quarantined[0].String()) {
		t.Fatalf("GET /quarantine with PublicRead: %d", code)
	}
	if code, _ := pub.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {f.quarantined[0].String()}}, nil); code != http.StatusUnauthorized {
		t.Fatalf("POST retry with PublicRead and no session: %d, want 401", code)
	}
}

// TestLogoutEndsSessionServerSide: after a logout, the session's cookie,
// replayed (a copy kept by a browser or stolen), is refused.
func TestLogoutEndsSessionServerSide(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, _ := countingPool(t)
	srv := serve(t, outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken})
	c := newClient(t, srv)
	c.login("alice")
	u, _ := url.Parse(srv.URL)
	cookies := c.http.Jar.Cookies(u)
	if len(cookies) != 1 {
		t.Fatalf("%d cookies after login, want the session's", len(cookies))
	}
	stolen := *cookies[0]
	csrf := c.csrf
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	replay := newClient(t, srv)
	replay.http.Jar.SetCookies(u, []*http.Cookie{&stolen})
	if code, _ := replay.get("/login"); code != http.StatusOK {
		t.Fatalf("GET /login: %d", code)
	}
	if code, body := replay.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {"00000000-0000-0000-0000-000000000001"}, "csrf": {csrf}}, nil); code != http.StatusUnauthorized {
		t.Fatalf("a POST with the session cookie after logout: %d, want 401 (%s)", code, strings.TrimSpace(body))
	}
	if code, _ := replay.get("/operations"); code != http.StatusSeeOther {
		t.Fatalf("a page with the session cookie after logout: %d, want 303 to the login", code)
	}
	// Another session of the same operator is not affected.
	c.login("alice")
	if code, _ := c.get("/operations"); code != http.StatusOK {
		t.Fatalf("a new session after the logout: %d", code)
	}
}

// TestLoginThrottled: after a few wrong tokens from one address, a login
// is answered 429, even with the right token, before the token is checked.
func TestLoginThrottled(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, _ := countingPool(t)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken}))
	for i := range 5 {
		if code, _ := c.do(http.MethodPost, "/login", url.Values{"name": {"eve"}, "token": {"guess-number-" + string(rune('a'+i)) + "-xxxxxxxx"}}, nil); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	code, body := c.do(http.MethodPost, "/login", url.Values{"name": {"eve"}, "token": {testToken}}, nil)
	if code != http.StatusTooManyRequests || strings.Contains(body, testToken) {
		t.Fatalf("login after 5 wrong tokens: %d, want 429", code)
	}
}

// TestWeakTokenRefused: a token of too few different bytes is refused,
// however long, and the error does not repeat it.
func TestWeakTokenRefused(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, _ := countingPool(t)
	for _, tok := range []string{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababababab", "0123456012345601234560", "short-Tok3n"} {
		_, err := outboxconsole.New(outboxconsole.Config{Pool: pool, Schema: schema, Token: tok})
		if err == nil || strings.Contains(err.Error(), tok) {
			t.Errorf("token %.6s…: %v, want an error that does not repeat it", tok, err)
		}
	}
	if _, err := outboxconsole.New(outboxconsole.Config{Pool: pool, Schema: schema, Token: "0123456789abcdef"}); err != nil {
		t.Errorf("a token of 16 different bytes: %v", err)
	}
}

// TestBadFilterIs400: a NUL or bytes that are not UTF-8 in a filter, a
// cursor or a form are answered 400, not a 500 quoting PostgreSQL.
func TestBadFilterIs400(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1, 2)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	c.login("alice")
	for _, path := range []string{"/quarantine?type=%00", "/quarantine?type=%ff", "/inbox?consumer=a%00b", "/inbox?consumer=%c3%28",
		"/inbox?after=eyJDb25zdW1lciI6ImFcdTAwMDAifQ", // {"Consumer":"a\u0000"}
		"/events?event_type=%00", "/events?aggregate_type=a%ff&aggregate_id=b", "/quarantine/bulk?action=retry&error=a%00",
		"/events?event_type=X&after=eyJ0IjoiYVx1MDAwMCJ9"} { // {"t":"a\u0000"}
		code, body := c.get(path)
		if code != http.StatusBadRequest || strings.Contains(body, "SQLSTATE") || strings.Contains(body, "invalid byte sequence") {
			t.Errorf("GET %s: %d, want 400 without PostgreSQL's message:\n%s", path, code, body)
		}
	}
	if code, _ := c.do(http.MethodPost, "/quarantine/skip", url.Values{"event_id": {f.quarantined[0].String()}, "csrf": {c.csrf}, "reason": {"nul\x00here"}}, nil); code != http.StatusBadRequest {
		t.Errorf("skip with a NUL in the reason: %d, want 400", code)
	}
	if e, err := f.admin.Event(context.Background(), f.quarantined[0]); err != nil || e.State() != "quarantined" {
		t.Errorf("after the refused skip: %v, %v", e.State(), err)
	}
}

// TestHiddenCharactersShown: bidirectional overrides and zero-width
// characters in an event type, a last error or a skip reason are shown as
// [U+XXXX], so that a value cannot pass for another; a webhook URL in a
// last error (recorded by an older version) is shown without its path.
func TestHiddenCharactersShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 2, 2)
	if _, err := f.pool.Exec(ctx, `UPDATE `+f.schema+`.outbox_events SET event_type = $2,
		last_error = 'post event to https://hooks.slack.com/services/T0/B0/sl4ck-s3cret: 500 ' || $3
		WHERE event_id = $1`, f.quarantined[0], "Refund\u202Edesrever", "gnirts\u200Bhidden\u2066iso\u2069"); err != nil {
		t.Fatal(err)
	}
	f.refuse.Delete("pay-0001")
	if _, err := f.admin.Skip(ctx, f.quarantined[1], "cli:carol", "approved by\u202E nimda"); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	c.login("alice")
	for _, path := range []string{"/quarantine", "/", "/operations"} {
		code, body := c.get(path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		for _, r := range []string{"\u202E", "\u200B", "\u2066", "\u2069", "sl4ck-s3cret", "/services/"} {
			if strings.Contains(body, r) {
				t.Errorf("GET %s renders %q as it is", path, r)
			}
		}
	}
	_, body := c.get("/quarantine")
	body = html.UnescapeString(body)
	for _, want := range []string{"Refund[U+202E]desrever", "[U+200B]", "https://hooks.slack.com/xxxxx"} {
		if !strings.Contains(body, want) {
			t.Errorf("the quarantine page does not show %q", want)
		}
	}
	if _, body := c.get("/operations"); !strings.Contains(html.UnescapeString(body), "approved by[U+202E] nimda") {
		t.Errorf("the operations page does not show the reason's override as [U+202E]")
	}
}

// TestStaticNotListed: the static directory is not listed; its files are
// served.
func TestStaticNotListed(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, _ := countingPool(t)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: pool, Schema: schema}))
	for _, path := range []string{"/static/", "/static//", "/static/./"} {
		if code, body := c.get(path); code == http.StatusOK || strings.Contains(body, "console.css") || (path == "/static/" && code != http.StatusNotFound) {
			t.Errorf("GET %s: %d, want 404 without a listing:\n%s", path, code, body)
		}
	}
	if code, _ := c.get("/static/console.js"); code != http.StatusOK {
		t.Errorf("GET /static/console.js: %d", code)
	}
}
