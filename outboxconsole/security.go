package outboxconsole

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// TokenMinDistinctBytes is the fewest different bytes a token may hold:
// "aaaaaaaaaaaaaaaa" is 16 bytes long but one guess away.
const TokenMinDistinctBytes = 8

// checkToken refuses a token too short or of too few different bytes,
// without repeating it.
func checkToken(token string) error {
	if len(token) < TokenMinLength {
		return fmt.Errorf("outboxconsole: the token is too short: %d bytes, at least %d are needed (e.g. openssl rand -hex 32)", len(token), TokenMinLength)
	}
	distinct := map[byte]bool{}
	for i := 0; i < len(token); i++ {
		distinct[token[i]] = true
	}
	if len(distinct) < TokenMinDistinctBytes {
		return fmt.Errorf("outboxconsole: the token is too easy to guess: %d different bytes, at least %d are needed (e.g. openssl rand -hex 32)", len(distinct), TokenMinDistinctBytes)
	}
	return nil
}

// CheckToken reports whether token is acceptable as Config.Token: at least
// TokenMinLength bytes and TokenMinDistinctBytes different bytes. The
// error never repeats the token.
func CheckToken(token string) error { return checkToken(token) }

// hostSet is the Host header values a console answers.
type hostSet struct {
	any   bool
	names map[string]bool // host names and addresses, any port
	exact map[string]bool // host:port
}

// loopbackHosts are the names a console on this machine is reached by.
var loopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// newHostSet reads Config.AllowedHosts: "*" allows any host; an entry
// with a port ("outbox.example.com:8443", "[::1]:8089") allows that host
// and port, one without ("outbox.example.com", "::1") that host on any
// port. None: the loopback names, and the host of origin when set.
func newHostSet(allowed []string, origin string) (hostSet, error) {
	hs := hostSet{names: map[string]bool{}, exact: map[string]bool{}}
	if len(allowed) == 0 {
		allowed = append([]string(nil), loopbackHosts...)
	}
	if origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" {
			return hs, fmt.Errorf("outboxconsole: Config.Origin %q is not an origin (want https://host[:port])", origin)
		}
		allowed = append(allowed, u.Host)
	}
	for _, a := range allowed {
		a = strings.ToLower(strings.TrimSpace(a))
		switch {
		case a == "":
		case a == "*":
			hs.any = true
		default:
			if h, p, err := net.SplitHostPort(a); err == nil {
				hs.exact[net.JoinHostPort(h, p)] = true
			} else {
				hs.names[strings.TrimSuffix(strings.TrimPrefix(a, "["), "]")] = true
			}
		}
	}
	if !hs.any && len(hs.names) == 0 && len(hs.exact) == 0 {
		return hs, errors.New("outboxconsole: Config.AllowedHosts allows no host")
	}
	return hs, nil
}

// allows reports whether a request's Host header names the console.
func (hs hostSet) allows(host string) bool {
	if hs.any {
		return true
	}
	host = strings.ToLower(host)
	if h, p, err := net.SplitHostPort(host); err == nil {
		return hs.exact[net.JoinHostPort(h, p)] || hs.names[h]
	}
	return host != "" && hs.names[strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")]
}

// revocations are the session cookies logged out of, each until it
// expires.
type revocations struct {
	mu      sync.Mutex
	expires map[string]int64
}

func (rv *revocations) add(session string, exp, now int64) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.expires == nil {
		rv.expires = map[string]int64{}
	}
	for s, e := range rv.expires {
		if e <= now {
			delete(rv.expires, s)
		}
	}
	rv.expires[session] = exp
}

func (rv *revocations) has(session string, now int64) bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	e, ok := rv.expires[session]
	return ok && e > now
}

// Login throttling: each client address may fail loginBurst times, then
// once per loginRefill; all clients together globalBurst times, then once
// per globalRefill (a guesser behind many addresses).
const (
	loginBurst     = 5
	loginRefill    = 12 * time.Second
	globalBurst    = 50
	globalRefill   = time.Second
	throttleMaxIPs = 10000
)

// loginThrottle counts failed logins in token buckets.
type loginThrottle struct {
	mu     sync.Mutex
	perIP  map[string]*bucket
	global bucket
}

// bucket is a token bucket: tokens left at a time.
type bucket struct {
	tokens float64
	at     time.Time
}

func (b *bucket) level(now time.Time, burst int, refill time.Duration) float64 {
	if b.at.IsZero() {
		return float64(burst)
	}
	return min(float64(burst), b.tokens+float64(now.Sub(b.at))/float64(refill))
}

// allow reports whether a login attempt from ip may be checked now, and
// otherwise how long to wait.
func (t *loginThrottle) allow(ip string, now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g := t.global.level(now, globalBurst, globalRefill); g < 1 {
		return time.Duration((1 - g) * float64(globalRefill)), false
	}
	if b := t.perIP[ip]; b != nil {
		if l := b.level(now, loginBurst, loginRefill); l < 1 {
			return time.Duration((1 - l) * float64(loginRefill)), false
		}
	}
	return 0, true
}

// failed spends a token of ip's bucket and of the global one.
func (t *loginThrottle) failed(ip string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.perIP == nil {
		t.perIP = map[string]*bucket{}
	}
	if len(t.perIP) >= throttleMaxIPs {
		for k, b := range t.perIP {
			if b.level(now, loginBurst, loginRefill) >= loginBurst {
				delete(t.perIP, k) // full again: nothing to remember
			}
		}
	}
	b := t.perIP[ip]
	if b == nil {
		b = &bucket{}
		t.perIP[ip] = b
	}
	b.tokens, b.at = b.level(now, loginBurst, loginRefill)-1, now
	t.global.tokens, t.global.at = t.global.level(now, globalBurst, globalRefill)-1, now
}

// safeText makes text from the database or a request safe to show as it
// is: invalid UTF-8 becomes U+FFFD, and characters that change how the
// text around them reads without being seen (bidirectional overrides and
// isolates, zero-width characters, other format and control characters)
// are shown as [U+XXXX], so that an id, a type or a reason cannot pass
// for another.
func safeText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	clean := true
	for _, r := range s {
		if hidden(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hidden(r) {
			fmt.Fprintf(&b, "[U+%04X]", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// hidden reports whether r is invisible or reorders text: format
// characters (Cf: bidi controls, zero-width space/joiners, BOM, soft
// hyphen, ...), and control characters other than tab and newline.
func hidden(r rune) bool {
	return unicode.Is(unicode.Cf, r) || (unicode.IsControl(r) && r != '\t' && r != '\n')
}

// validText reports whether a filter or form value can be looked up:
// UTF-8 without NUL (which PostgreSQL's text cannot hold).
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
