package outboxconsole

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
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

// revocations are the sessions logged out of (their nonces), each until it
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

// Login throttling. Each client (an IPv4 address, or an IPv6 /64: one
// host's share) may fail loginBurst times, then once per loginRefill: an
// attacker slows down only the addresses it sends from. All failing clients
// together may fail globalBurst times, then once per globalRefill (a
// guesser behind many addresses). The global bucket never stops a client
// with no failure of its own in the last loginRefill (its bucket full, or
// none): so no attacker, however many addresses it fails from, can lock
// the operator out; an operator who mistyped waits at most loginRefill.
// Memory is bounded: at most throttleMaxClients buckets; when they are all
// in use, the fullest (least suspect) is forgotten.
const (
	loginBurst         = 5
	loginRefill        = 12 * time.Second
	globalBurst        = 50
	globalRefill       = time.Second
	throttleMaxClients = 10000
)

// loginThrottle counts failed logins in token buckets.
type loginThrottle struct {
	mu      sync.Mutex
	clients map[string]*bucket
	global  bucket
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

// throttleKey is the client a login attempt is counted against: the
// address, or for IPv6 its /64 (an attacker's host has a whole /64).
func throttleKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	if a.Is4() || a.Is4In6() {
		return a.Unmap().String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// allow reports whether a login attempt from client may be checked now,
// and otherwise how long to wait.
func (t *loginThrottle) allow(client string, now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.clients[client]
	if b == nil {
		return 0, true // no failure of its own: never throttled
	}
	l := b.level(now, loginBurst, loginRefill)
	if l < 1 {
		return time.Duration((1 - l) * float64(loginRefill)), false
	}
	if l >= loginBurst {
		return 0, true
	}
	if g := t.global.level(now, globalBurst, globalRefill); g < 1 {
		// Until its own bucket is full again (it is suspect) or a global
		// token comes back, whichever is first.
		return min(time.Duration((1-g)*float64(globalRefill)), time.Duration((loginBurst-l)*float64(loginRefill))), false
	}
	return 0, true
}

// failed spends a token of client's bucket and of the global one.
func (t *loginThrottle) failed(client string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.clients == nil {
		t.clients = map[string]*bucket{}
	}
	b := t.clients[client]
	if b == nil {
		if len(t.clients) >= throttleMaxClients {
			t.forgetOne(now)
		}
		b = &bucket{}
		t.clients[client] = b
	}
	b.tokens, b.at = b.level(now, loginBurst, loginRefill)-1, now
	t.global.tokens, t.global.at = t.global.level(now, globalBurst, globalRefill)-1, now
}

// forgetOne drops the buckets full again, or else the fullest one.
func (t *loginThrottle) forgetOne(now time.Time) {
	fullest, level := "", -1.0
	for k, b := range t.clients {
		l := b.level(now, loginBurst, loginRefill)
		if l >= loginBurst {
			delete(t.clients, k) // nothing to remember
			continue
		}
		if l > level {
			fullest, level = k, l
		}
	}
	if len(t.clients) >= throttleMaxClients {
		delete(t.clients, fullest)
	}
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

// hidden reports whether r is invisible, reorders text, or passes for
// another character: every character that is not graphic (Cc controls
// other than tab and newline; Cf format characters: bidi embeddings,
// overrides, isolates U+2066–U+2069, marks U+200E, U+200F, U+061C,
// zero-width space and joiners, BOM, soft hyphen, tag characters; Zl and
// Zp separators; private use, surrogates and unassigned code points),
// spaces other than U+0020 (no-break, en, ideographic, ...), variation
// selectors (U+FE00–U+FE0F, U+E0100–U+E01EF, Mongolian), the other
// default-ignorable code points (combining grapheme joiner, Hangul
// fillers, U+E0000–U+E0FFF) and the blank Braille pattern U+2800.
func hidden(r rune) bool {
	switch r {
	case ' ', '\t', '\n':
		return false
	case 0x2800:
		return true
	}
	return !unicode.IsGraphic(r) || unicode.Is(unicode.Zs, r) ||
		unicode.Is(unicode.Variation_Selector, r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		(0xE0000 <= r && r <= 0xE0FFF)
}

// validText reports whether a filter or form value can be looked up:
// UTF-8 without NUL (which PostgreSQL's text cannot hold).
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
