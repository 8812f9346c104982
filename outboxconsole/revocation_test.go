package outboxconsole_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// base64URL is the alphabet of the session cookie's parts.
const base64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// Security review of issue 19, item 11: a logout revokes the session, not
// the cookie's text. The cookie's signature is 32 bytes in unpadded base64:
// its last character carries 4 bits and 2 unused ones, which a lenient
// decoder ignores, so the same session has several texts. A copy of a
// logged-out cookie with those bits changed must be refused like the
// cookie itself; before the fix it was a valid session again.
func TestLogoutRevokesEveryTextOfTheSession(t *testing.T) {
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
	value := cookies[0].Value
	last := strings.IndexByte(base64URL, value[len(value)-1])
	var variants []string
	for bits := 1; bits < 4; bits++ { // the two unused bits, changed
		variants = append(variants, value[:len(value)-1]+string(base64URL[last^bits]))
	}
	variants = append(variants, value+"=", value+"==") // padding
	// Before the logout a variant is no session of its own either: the
	// signature is read strictly.
	other := newClient(t, srv)
	other.http.Jar.SetCookies(u, []*http.Cookie{{Name: cookies[0].Name, Value: variants[0]}})
	if code, _ := other.get("/operations"); code != http.StatusSeeOther {
		t.Errorf("a page with another text of a live session's cookie: %d, want 303 to the login", code)
	}
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {c.csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	for _, v := range variants {
		replay := newClient(t, srv)
		replay.http.Jar.SetCookies(u, []*http.Cookie{{Name: cookies[0].Name, Value: v}})
		if code, _ := replay.get("/operations"); code != http.StatusSeeOther {
			t.Errorf("a page with the logged-out cookie written %q: %d, want 303 to the login", v[len(v)-3:], code)
		}
		if code, _ := replay.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {"00000000-0000-0000-0000-000000000001"}, "csrf": {c.csrf}}, nil); code != http.StatusUnauthorized {
			t.Errorf("a POST with the logged-out cookie written %q: %d, want 401", v[len(v)-3:], code)
		}
	}
}
