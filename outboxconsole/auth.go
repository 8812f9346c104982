package outboxconsole

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
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
// in the audit log as "console:<name>".
var namePattern = regexp.MustCompile(`^[A-Za-z0-9._@+-]{1,64}$`)

// deriveKey keys the session HMACs from the token and a per-process salt.
func deriveKey(token string, salt []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("outbox console session v1\x00"))
	m.Write(salt)
	return m.Sum(nil)
}

func (c *console) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, c.sessionKey)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// tokenMatches compares a presented token with the configured one in
// constant time (digests first, so that the length does not leak either).
func (c *console) tokenMatches(presented string) bool {
	if c.cfg.Token == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(presented)), sha256.Sum256([]byte(c.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// newSession returns a session cookie's value: the name, the expiry and
// their HMAC.
func (c *console) newSession(name string, now time.Time) string {
	exp := strconv.FormatInt(now.Add(c.cfg.SessionTTL).Unix(), 10)
	n := base64.RawURLEncoding.EncodeToString([]byte(name))
	return n + "." + exp + "." + base64.RawURLEncoding.EncodeToString(c.mac("session", n, exp))
}

// session checks the request's session cookie and returns the operator's
// name and the cookie's value.
func (c *console) session(r *http.Request) (name, value string, ok bool) {
	if c.sessionKey == nil {
		return "", "", false
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", "", false
	}
	parts := strings.Split(ck.Value, ".")
	if len(parts) != 3 {
		return "", "", false
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, c.mac("session", parts[0], parts[1])) {
		return "", "", false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || time.Now().Unix() >= exp {
		return "", "", false
	}
	n, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || !namePattern.Match(n) {
		return "", "", false
	}
	return string(n), ck.Value, true
}

// csrfToken is the token the forms of a session carry.
func (c *console) csrfToken(sessionValue string) string {
	return hex.EncodeToString(c.mac("csrf", sessionValue))
}

// sameOrigin reports whether a POST comes from the console's own pages:
// its Origin header, or else its Referer, must be the console's origin.
// A request with neither is refused.
func (c *console) sameOrigin(r *http.Request) bool {
	want := c.cfg.Origin
	if want == "" {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		want = scheme + "://" + r.Host
	}
	want = strings.TrimSuffix(want, "/")
	if o := r.Header.Get("Origin"); o != "" {
		return strings.EqualFold(o, want)
	}
	if ref := r.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		return err == nil && strings.EqualFold(u.Scheme+"://"+u.Host, want)
	}
	return false
}

type ctxKey int

const operatorKey ctxKey = 0

// operator is the logged-in operator's name, set by guard on requests with
// a valid session.
type operator struct{ name, session string }

func operatorOf(r *http.Request) (operator, bool) {
	op, ok := r.Context().Value(operatorKey).(operator)
	return op, ok
}

// guard sets the security headers, attaches the session to the request,
// and refuses every POST that is not allowed, before routing and before
// any database work: 403 in read-only mode, 403 from another origin, 401
// without a valid session (or, at login, with a wrong token), 403 without
// the session's CSRF token. Other methods than GET, HEAD and POST get 405.
func (c *console) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		if name, value, ok := c.session(r); ok {
			r = r.WithContext(context.WithValue(r.Context(), operatorKey, operator{name: name, session: value}))
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			next.ServeHTTP(w, r)
			return
		case http.MethodPost:
		default:
			h.Set("Allow", "GET, HEAD, POST")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if c.cfg.ReadOnly {
			http.Error(w, "the console is read-only", http.StatusForbidden)
			return
		}
		if !c.sameOrigin(r) {
			http.Error(w, "cross-origin request refused", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/login" {
			if !c.tokenMatches(r.PostForm.Get("token")) {
				c.log.Warn("console login refused", "remote_addr", r.RemoteAddr)
				c.render(w, r, http.StatusUnauthorized, "login", pageData{Error: "Wrong token."})
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
		want := c.csrfToken(op.session)
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get(csrfField)), []byte(want)) != 1 {
			http.Error(w, "missing or wrong CSRF token: reload the page", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (c *console) setSession(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil || strings.HasPrefix(c.cfg.Origin, "https:"), SameSite: http.SameSiteStrictMode})
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", pageData{})
}

// login runs after guard checked the token.
func (c *console) login(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimSpace(r.PostForm.Get("name"))
	if !namePattern.MatchString(name) {
		c.render(w, r, http.StatusBadRequest, "login", pageData{Error: "Give your name (letters, digits and . _ @ + -, at most 64): it goes into the audit log."})
		return
	}
	c.setSession(w, r, c.newSession(name, time.Now()), int(c.cfg.SessionTTL.Seconds()))
	c.log.Info("console login", "operator", name, "remote_addr", r.RemoteAddr)
	http.Redirect(w, r, "/quarantine", http.StatusSeeOther)
}

func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	c.setSession(w, r, "", -1)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
