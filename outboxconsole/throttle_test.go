package outboxconsole_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// loginFrom posts a login with token from the client address addr
// ("ip:port") and returns the answer's status.
func loginFrom(t *testing.T, h http.Handler, addr, token string) int {
	t.Helper()
	form := url.Values{"name": {"alice"}, "token": {token}}
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8089/login", strings.NewReader(form.Encode()))
	req.RemoteAddr = addr
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://127.0.0.1:8089")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// Security review of issue 19, item 11: failed logins from many addresses
// (a guesser, or someone who wants the operator locked out) exhaust the
// global budget of failures; that must not refuse the operator, whose
// address has failed nothing, with the right token. The attackers' own
// addresses stay throttled, each IPv6 /64 counts as one client, and an
// operator who mistyped is refused only until their own bucket refills.
// Before the fix the global bucket refused everybody: a lockout any remote
// client could cause.
func TestLoginThrottleLocksNobodyOut(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, _ := countingPool(t)
	h, err := outboxconsole.New(outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	// 20 addresses fail 3 times each (under the per-address burst): 60
	// failures, over the global budget.
	for i := range 20 {
		for j := range 3 {
			code := loginFrom(t, h, fmt.Sprintf("198.51.100.%d:4000", i+1), fmt.Sprintf("guess-%d-%d-abcdefgh", i, j))
			if code != http.StatusUnauthorized && code != http.StatusTooManyRequests {
				t.Fatalf("a wrong token: %d", code)
			}
		}
	}
	if code := loginFrom(t, h, "198.51.100.1:4000", "guess-again-abcdefgh"); code != http.StatusTooManyRequests {
		t.Errorf("an address that failed, with the global budget spent: %d, want 429", code)
	}
	if code := loginFrom(t, h, "203.0.113.7:5000", testToken); code != http.StatusSeeOther {
		t.Fatalf("the operator, from an address that failed nothing, with the right token: %d, want 303", code)
	}
	// An IPv6 attacker's host: its /64 is one client, whichever address.
	for i := range 5 {
		loginFrom(t, h, fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1), "guess-v6-abcdefgh")
	}
	if code := loginFrom(t, h, "[2001:db8:1:2::99]:4000", testToken); code != http.StatusTooManyRequests {
		t.Errorf("another address of a /64 that failed 5 times: %d, want 429", code)
	}
	if code := loginFrom(t, h, "[2001:db8:1:3::1]:4000", testToken); code != http.StatusSeeOther {
		t.Errorf("the next /64, which failed nothing: %d, want 303", code)
	}
}
