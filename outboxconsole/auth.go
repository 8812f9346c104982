package outboxconsole

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

const (
	sessionCookie = "outbox_console_session"
	csrfField     = "csrf"
	maxFormBytes  = 64 << 10
)

// namePattern is what an operator may call themselves at login: it ends up
// in the audit log as ActorTokenPrefix + name.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9._@+-]{1,64}$`)

// gate is what the pages of a console share however many outboxes it
// shows: the Host check, the login and its throttle, the sessions and
// their revocation, the proxy's identity, the CSRF tokens and the
// same-origin check. New builds one for its one schema; NewMulti one for
// all its sources, so that an operator logs in once.
type gate struct {
	token      string
	publicRead bool
	readOnly   bool
	origin     string
	sessionTTL time.Duration
	log        *slog.Logger
	hosts      hostSet
	cop        *http.CrossOriginProtection
	revoked    revocations
	throttle   loginThrottle
	proxy      proxyAuth
	sessionKey []byte
	// macKey keys the CSRF tokens (and the sessions' HMAC): the session
	// key with a token, a random key with a proxy.
	macKey []byte
	// home is where a login leads; isPage reports whether a GET of a path
	// is a page, to which a visitor without a session is sent to /login
	// rather than answered 401; render renders the login page.
	home   string
	isPage func(path string) bool
	render func(w http.ResponseWriter, r *http.Request, status int, page string, d pageData)
}

// newGate checks the shared settings and draws the session and CSRF keys.
func newGate(token string, publicRead, readOnly bool, origin string, sessionTTL time.Duration, log *slog.Logger,
	allowedHosts []string, proxyHeader string, trustedProxies []string) (*gate, error) {
	if token != "" {
		if err := checkToken(token); err != nil {
			return nil, err
		}
	}
	if sessionTTL <= 0 {
		sessionTTL = SessionTTLDefault
	}
	if log == nil {
		log = slog.Default()
	}
	proxy, err := newProxyAuth(proxyHeader, trustedProxies, token)
	if err != nil {
		return nil, err
	}
	if token == "" && !proxy.on() {
		readOnly = true
	}
	hosts, err := newHostSet(allowedHosts, origin)
	if err != nil {
		return nil, err
	}
	cop := http.NewCrossOriginProtection()
	if origin != "" {
		if err := cop.AddTrustedOrigin(strings.TrimSuffix(origin, "/")); err != nil {
			return nil, fmt.Errorf("outboxconsole: Config.Origin: %w", err)
		}
	}
	g := &gate{token: token, publicRead: publicRead, readOnly: readOnly, origin: origin, sessionTTL: sessionTTL, log: log,
		hosts: hosts, cop: cop, proxy: proxy}
	if token != "" {
		salt := make([]byte, 32)
		if _, err := rand.Read(salt); err != nil {
			return nil, err
		}
		g.sessionKey = deriveKey(token, salt)
		g.macKey = g.sessionKey
	}
	if proxy.on() {
		if g.macKey, err = newMACKey(); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// deriveKey keys the session HMACs from the token and a per-process salt.
func deriveKey(token string, salt []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("outbox console session v1\x00"))
	m.Write(salt)
	return m.Sum(nil)
}

func (g *gate) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, g.macKey)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// tokenMatches compares a presented token with the configured one in
// constant time (digests first, so that the length does not leak either).
func (g *gate) tokenMatches(presented string) bool {
	if g.token == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(presented)), sha256.Sum256([]byte(g.token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// newSession returns a session cookie's value: the name, the expiry, a
// random nonce (so that two logins never share a value, which logout
// revokes) and their HMAC.
func (g *gate) newSession(name string, now time.Time) string {
	exp := strconv.FormatInt(now.Add(g.sessionTTL).Unix(), 10)
	n := base64.RawURLEncoding.EncodeToString([]byte(name))
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce) // crypto/rand never fails
	r := base64.RawURLEncoding.EncodeToString(nonce)
	return n + "." + exp + "." + r + "." + base64.RawURLEncoding.EncodeToString(g.mac("session", n, exp, r))
}

// session checks the request's session cookie and returns the operator's
// name and the session's identity: its nonce, as signed. Revocation and the
// CSRF token key on that identity, never on the cookie's text: base64 has
// more than one text for the same bytes (the unused low bits of the last
// character; padding), so a copy of a logged-out cookie with its signature
// written differently would otherwise pass as another session. The
// signature is decoded strictly besides.
func (g *gate) session(r *http.Request) (name, id string, ok bool) {
	if g.sessionKey == nil {
		return "", "", false
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", "", false
	}
	parts := strings.Split(ck.Value, ".")
	if len(parts) != 4 {
		return "", "", false
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(parts[3])
	if err != nil || !hmac.Equal(sig, g.mac("session", parts[0], parts[1], parts[2])) {
		return "", "", false
	}
	// parts[2] is the nonce exactly as signed: no other text of it has
	// this signature.
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || time.Now().Unix() >= exp || g.revoked.has(parts[2], time.Now().Unix()) {
		return "", "", false
	}
	n, err := base64.RawURLEncoding.Strict().DecodeString(parts[0])
	if err != nil || !namePattern.Match(n) {
		return "", "", false
	}
	return string(n), sessionID{nonce: parts[2], exp: exp}.String(), true
}

// sessionID is a session's identity: its signed nonce and expiry.
type sessionID struct {
	nonce string
	exp   int64
}

func (s sessionID) String() string { return s.nonce + "." + strconv.FormatInt(s.exp, 10) }

// parseSessionID reads what sessionID.String wrote.
func parseSessionID(s string) (sessionID, bool) {
	nonce, exp, ok := strings.Cut(s, ".")
	e, err := strconv.ParseInt(exp, 10, 64)
	return sessionID{nonce: nonce, exp: e}, ok && err == nil
}

// csrfToken is the token the forms of a session (its identity) carry.
func (g *gate) csrfToken(session string) string {
	return hex.EncodeToString(g.mac("csrf", session))
}

// sameOrigin reports whether a POST comes from the console's own pages.
// http.CrossOriginProtection decides first (Sec-Fetch-Site, or the Origin
// header's host against Host or Config.Origin); a request that has neither
// header, which it lets through as a non-browser request, must then carry a
// Referer of the console's origin. A request with no clue at all is
// refused: the CSRF token is checked besides.
func (g *gate) sameOrigin(r *http.Request) bool {
	if g.cop.Check(r) != nil {
		return false
	}
	if r.Header.Get("Sec-Fetch-Site") != "" || r.Header.Get("Origin") != "" {
		return true
	}
	want := g.origin
	if want == "" {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		want = scheme + "://" + r.Host
	}
	want = strings.TrimSuffix(want, "/")
	if ref := r.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		return err == nil && strings.EqualFold(u.Scheme+"://"+u.Host, want)
	}
	return false
}

type ctxKey int

const operatorKey ctxKey = 0

// operator is the logged-in operator's name and session identity
// (sessionID), set by guard on requests with a valid session; viaProxy
// when a trusted proxy named the operator instead (proxyIdentity).
type operator struct {
	name, session string
	viaProxy      bool
}

func operatorOf(r *http.Request) (operator, bool) {
	op, ok := r.Context().Value(operatorKey).(operator)
	return op, ok
}

// guard sets the security headers, refuses a request for another host
// (421: DNS rebinding), attaches the session to the request, sends a
// visitor without a session to the login page when pages need one, and
// refuses every POST that is not allowed, before routing and before any
// database work: 403 in read-only mode (but for logging in and out), 403
// from another origin, 429 after too many failed logins, 401 without a
// valid session (or, at login, with a wrong token), 403 without the
// session's CSRF token. Other methods than GET, HEAD and POST get 405.
func (g *gate) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		if !g.hosts.allows(r.Host) {
			g.log.Warn("console: request for a host it does not serve refused", "host", safeText(r.Host), "remote_addr", r.RemoteAddr)
			http.Error(w, "misdirected request: this console does not serve that host name (start it with --allowed-host NAME, or set Config.AllowedHosts)", http.StatusMisdirectedRequest)
			return
		}
		if name, value, ok := g.session(r); ok {
			r = r.WithContext(context.WithValue(r.Context(), operatorKey, operator{name: name, session: value}))
		}
		var ok bool
		if r, ok = g.proxyIdentity(w, r); !ok {
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			if g.loginRequired(r) {
				if g.isPage(r.URL.Path) {
					http.Redirect(w, r, "/login", http.StatusSeeOther)
					return
				}
				http.Error(w, "log in first: the console's pages need the console token", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
			return
		case http.MethodPost:
		default:
			h.Set("Allow", "GET, HEAD, POST")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		account := r.URL.Path == "/login" || r.URL.Path == "/logout"
		if g.readOnly && !(account && g.sessionKey != nil) {
			http.Error(w, "the console is read-only", http.StatusForbidden)
			return
		}
		if !g.sameOrigin(r) {
			http.Error(w, "cross-origin request refused", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		for _, vs := range r.PostForm {
			for _, v := range vs {
				if !validText(v) {
					http.Error(w, "bad form: a value holds a NUL or bytes that are not UTF-8", http.StatusBadRequest)
					return
				}
			}
		}
		if r.URL.Path == "/login" {
			if wait, ok := g.throttle.allow(throttleKey(clientIP(r)), time.Now()); !ok {
				g.log.Warn("console login throttled", "remote_addr", r.RemoteAddr)
				h.Set("Retry-After", strconv.Itoa(int(wait.Seconds()+1)))
				g.render(w, r, http.StatusTooManyRequests, "login", pageData{Error: "Too many failed logins: wait a minute."})
				return
			}
			if !g.tokenMatches(r.PostForm.Get("token")) {
				g.throttle.failed(throttleKey(clientIP(r)), time.Now())
				g.log.Warn("console login refused", "remote_addr", r.RemoteAddr)
				g.render(w, r, http.StatusUnauthorized, "login", pageData{Error: "Wrong token."})
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		op, ok := operatorOf(r)
		if !ok {
			http.Error(w, "log in first: actions need the console token", http.StatusUnauthorized)
			return
		}
		want := g.csrfToken(op.session)
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get(csrfField)), []byte(want)) != 1 {
			http.Error(w, "missing or wrong CSRF token: reload the page", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loginRequired reports whether a GET needs a session (or the proxy's
// identity) it lacks: whenever the console has a token or a proxy and
// Config.PublicRead is off, for everything but the login page and the
// static files (which hold no data).
func (g *gate) loginRequired(r *http.Request) bool {
	if (g.sessionKey == nil && !g.proxy.on()) || g.publicRead {
		return false
	}
	if _, ok := operatorOf(r); ok {
		return false
	}
	return r.URL.Path != "/login" && !strings.HasPrefix(r.URL.Path, "/static/")
}

// clientIP is the host part of the request's remote address.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (g *gate) setSession(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil || strings.HasPrefix(g.origin, "https:"), SameSite: http.SameSiteStrictMode})
}

func (g *gate) loginPage(w http.ResponseWriter, r *http.Request) {
	g.render(w, r, http.StatusOK, "login", pageData{})
}

// login runs after guard checked the token.
func (g *gate) login(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimSpace(r.PostForm.Get("name"))
	if !namePattern.MatchString(name) {
		g.render(w, r, http.StatusBadRequest, "login", pageData{Error: "Give your name (letters, digits and . _ @ + -, at most 64): it goes into the audit log."})
		return
	}
	g.setSession(w, r, g.newSession(name, time.Now()), int(g.sessionTTL.Seconds()))
	g.log.Info("console login", "operator", name, "remote_addr", r.RemoteAddr)
	http.Redirect(w, r, g.home, http.StatusSeeOther)
}

// logout ends the session on the server too: its identity (the signed
// nonce) is revoked until it expires, so a copy of the cookie (a stolen
// one, a browser that kept it), however its text is written, is refused
// from now on.
func (g *gate) logout(w http.ResponseWriter, r *http.Request) {
	if op, ok := operatorOf(r); ok {
		exp := time.Now().Add(g.sessionTTL).Unix()
		id, ok := parseSessionID(op.session)
		if ok {
			exp = id.exp
		}
		g.revoked.add(id.nonce, exp, time.Now().Unix())
		g.log.Info("console logout", "operator", op.name, "remote_addr", r.RemoteAddr)
	}
	g.setSession(w, r, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
