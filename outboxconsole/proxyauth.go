package outboxconsole

// Who the operator is, from an authenticating reverse proxy (oauth2-proxy,
// an ingress or gateway with single sign-on): the proxy signs the operator
// in, then passes their name in a header it sets on every request it
// forwards. The console believes that header only from the proxy's own
// address, the TCP peer of the request: never from X-Forwarded-For,
// Forwarded or X-Real-IP, which any client writes.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ProxyNameMaxLength is the longest operator name, in bytes, the console
// takes from Config.AuthProxyHeader (an e-mail address is at most 254); a
// longer value is refused with 400.
const ProxyNameMaxLength = 256

// proxyAuth is the identity taken from a trusted proxy's header; the zero
// value is off.
type proxyAuth struct {
	header  string // canonical header name
	trusted []netip.Prefix
}

func (p proxyAuth) on() bool { return p.header != "" }

// newProxyAuth reads Config.AuthProxyHeader and Config.TrustedProxies:
// both or neither.
func newProxyAuth(header string, trusted []string, token string) (proxyAuth, error) {
	header = strings.TrimSpace(header)
	var p proxyAuth
	switch {
	case header == "" && len(trusted) == 0:
		return p, nil
	case header == "":
		return p, errors.New("outboxconsole: Config.TrustedProxies without Config.AuthProxyHeader: name the header the proxy passes the operator in")
	case len(trusted) == 0:
		return p, errors.New("outboxconsole: Config.AuthProxyHeader without Config.TrustedProxies: give the proxy's addresses, the only ones whose header is believed")
	case token != "":
		return p, errors.New("outboxconsole: Config.Token and Config.AuthProxyHeader are exclusive: the proxy's identity replaces the token login")
	case !isHeaderName(header):
		return p, fmt.Errorf("outboxconsole: Config.AuthProxyHeader %q is not a header name", header)
	}
	p.header = http.CanonicalHeaderKey(header)
	for _, s := range trusted {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		pfx, err := parseTrusted(s)
		if err != nil {
			return p, err
		}
		p.trusted = append(p.trusted, pfx)
	}
	if len(p.trusted) == 0 {
		return p, errors.New("outboxconsole: Config.TrustedProxies holds no address")
	}
	return p, nil
}

// parseTrusted reads one trusted proxy: an address ("10.0.0.7", "::1") or
// a network ("10.0.0.0/24"). A network of every address (/0) is refused:
// with it, any client could name itself.
func parseTrusted(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return pfx, fmt.Errorf("outboxconsole: trusted proxy %q is not an address or a network (10.0.0.7, 10.0.0.0/24, fd00::/64)", s)
		}
		if pfx.Addr().Is4In6() && pfx.Bits() >= 96 {
			// Go reports an IPv4 peer as such, even on an IPv6 socket.
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		if pfx.Bits() == 0 || pfx.Addr().Is4In6() {
			return pfx, fmt.Errorf("outboxconsole: trusted proxy %q trusts every address (or every IPv4 one): any client could name itself; give the proxy's addresses", s)
		}
		return pfx.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("outboxconsole: trusted proxy %q is not an address or a network (10.0.0.7, 10.0.0.0/24, fd00::/64)", s)
	}
	a = a.WithZone("").Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// isHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func isHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}

// trusts reports whether the request comes straight from a trusted proxy:
// its remote address (the TCP peer), nothing the request says about
// itself.
func (p proxyAuth) trusts(r *http.Request) bool {
	a, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false // a Unix socket, a handler called without a peer
	}
	ip := a.Addr().WithZone("").Unmap()
	for _, pfx := range p.trusted {
		if pfx.Contains(ip) {
			return true
		}
	}
	return false
}

// proxyName checks the header's value: exactly one, valid UTF-8, 1 to
// ProxyNameMaxLength bytes, no control character (tab included), no
// format or other invisible character (safeText's hidden: no bidi
// override, no zero-width space), no leading or trailing space.
func proxyName(values []string) (string, error) {
	if len(values) != 1 {
		return "", fmt.Errorf("%d values (the proxy must set it once, replacing what the client sent)", len(values))
	}
	v := values[0]
	switch {
	case v == "":
		return "", errors.New("empty")
	case len(v) > ProxyNameMaxLength:
		return "", fmt.Errorf("%d bytes, at most %d", len(v), ProxyNameMaxLength)
	case !utf8.ValidString(v):
		return "", errors.New("not UTF-8")
	case strings.TrimSpace(v) != v:
		return "", errors.New("leading or trailing space")
	}
	for _, r := range v {
		if hidden(r) || unicode.IsControl(r) {
			return "", fmt.Errorf("holds U+%04X", r)
		}
	}
	return v, nil
}

// proxyIdentity attaches the operator the trusted proxy names to the
// request. It answers (and returns false) a request that carries the
// header without coming from a trusted proxy (403: a client naming itself)
// or with a value that is not a name (400). A request without the header
// goes on without an operator.
func (g *gate) proxyIdentity(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if !g.proxy.on() {
		return r, true
	}
	values := r.Header.Values(g.proxy.header)
	if len(values) == 0 {
		return r, true
	}
	if !g.proxy.trusts(r) {
		g.log.Warn("console: request carrying the proxy's identity header from an address that is not a trusted proxy refused",
			"header", g.proxy.header, "remote_addr", r.RemoteAddr)
		http.Error(w, "forbidden: "+g.proxy.header+" is believed only from a trusted proxy (--trusted-proxy)", http.StatusForbidden)
		return r, false
	}
	name, err := proxyName(values)
	if err != nil {
		g.log.Warn("console: the proxy's identity header refused", "header", g.proxy.header, "reason", err.Error(), "remote_addr", r.RemoteAddr)
		http.Error(w, "bad request: "+g.proxy.header+" is not an operator name: "+err.Error(), http.StatusBadRequest)
		return r, false
	}
	// The forms' CSRF token is keyed on this identity: the same for every
	// request of this operator while the console runs, never guessable
	// from another site (the key is drawn at start-up).
	op := operator{name: name, session: "proxy:" + name, viaProxy: true}
	return r.WithContext(context.WithValue(r.Context(), operatorKey, op)), true
}

// newMACKey draws the key of the forms' CSRF tokens for a console whose
// operators come from a proxy (with a token, the session key serves).
func newMACKey() ([]byte, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	return k, nil
}
