// Package redact hides secrets in what the binaries print: connection
// strings (PostgreSQL URLs and key=value strings), destination URLs, and
// known secret values inside arbitrary text such as a library's error.
// Every binary and the console use it, so that a password, token or signing
// secret shows up as Mask in logs, errors, --help and status output, and
// nowhere else.
package redact

import (
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// secretKeys are the query parameters and key=value keys whose values are
// secrets, lower case.
var secretKeys = map[string]bool{
	"password":      true,
	"sslpassword":   true,
	"pass":          true,
	"passwd":        true,
	"secret":        true,
	"token":         true,
	"auth_token":    true,
	"access_token":  true,
	"client_secret": true,
	"api_key":       true,
	"apikey":        true,
	"key":           true,
	"sig":           true,
	"signature":     true,
}

// IsSecretKey reports whether a query parameter or connection-string key
// of this name holds a secret (password, sslpassword, token, ...).
func IsSecretKey(k string) bool { return secretKeys[strings.ToLower(k)] }

// URL returns raw with the password of its user part and the values of
// query parameters that hold secrets (password, sslpassword, token, key,
// ...) replaced by Mask. A user name alone stays, except in a nats:// or
// tls:// URL, where it is a token, and in a user part with more than one
// '@' (an unencoded '@' in a password: where it ends is ambiguous) or with
// an '@' after a '/', '?' or '#' (an unencoded one of those in a password),
// which is hidden whole, up to the last '@' (nats:// and tls:// URLs
// included). A NATS server list ("nats://a@h1,b@h2") has each server's
// user part hidden, and a server that is not host[:port] either (the head
// of a password holding an unencoded ',') hidden whole. An http:// or https:// URL is shown as
// Webhook shows it. Leading and trailing spaces and the case of the scheme
// do not matter. A URL that does not parse is not shown: the result is its
// scheme and a note. A bare name ("nats", "webhook": letters, digits, '.',
// '-' and '_' only) is no URL and has no place for a secret: it is returned
// as it is.
func URL(raw string) string {
	t := strings.TrimSpace(raw)
	if bareName(t) {
		return t
	}
	switch schemeOf(t) {
	case "http", "https":
		return Webhook(t)
	case "nats", "tls":
		return natsList(t)
	}
	return genericURL(t)
}

// schemeOf returns the lower-cased scheme of a URL-like string ("" when it
// has none).
func schemeOf(s string) string {
	i := strings.IndexByte(s, ':')
	if i <= 0 {
		return ""
	}
	for j := 0; j < i; j++ {
		c := s[j]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || j > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return ""
		}
	}
	return strings.ToLower(s[:i])
}

// authority returns the authority of a scheme://authority/... string (up
// to the first '/', '?' or '#'), its start and whether there is one.
func authority(s string) (auth string, start int, ok bool) {
	i := strings.Index(s, "://")
	if i < 0 || schemeOf(s) == "" || i != len(schemeOf(s)) {
		return "", 0, false
	}
	start = i + 3
	auth = s[start:]
	if j := strings.IndexAny(auth, "/?#"); j >= 0 {
		auth = auth[:j]
	}
	return auth, start, true
}

func genericURL(t string) string {
	auth, start, ok := authority(t)
	if !ok {
		// "postgres:/u:pw@h", "amqp:u:pw@h": no authority that a parser
		// would agree on.
		return unparsable(t)
	}
	if at := strings.LastIndexByte(t[start:], '@'); at >= len(auth) {
		// An '@' past the first '/', '?' or '#': an unencoded one of those
		// in the password ended the authority early, and a parser would
		// show the password's tail as the path, query or fragment. Hide
		// all up to the last '@' (an '@' in a genuine path or query then
		// hides more than the user part: never less).
		t = t[:start] + Mask + t[start+at:]
	} else if strings.Count(auth, "@") > 1 {
		// An unencoded '@' in the user part: hide all of it.
		at := strings.LastIndexByte(auth, '@')
		t = t[:start] + Mask + t[start+at:]
	}
	u, err := url.Parse(t)
	if err != nil || u.Opaque != "" || u.Host == "" {
		return unparsable(t)
	}
	if u.User != nil && u.User.Username() != Mask {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	u.RawQuery = redactQuery(u.RawQuery)
	if u.User != nil && u.User.Username() == Mask {
		u.User = nil
		return u.Scheme + "://" + Mask + "@" + strings.TrimPrefix(u.String(), u.Scheme+"://")
	}
	return u.String()
}

// redactQuery masks the values of secret parameters of a raw query.
func redactQuery(raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			parts[i] = "(not shown)"
		} else if IsSecretKey(name) {
			parts[i] = k + "=" + Mask
		}
	}
	return strings.Join(parts, "&")
}

// natsList redacts a nats:// or tls:// URL whose host part may list several
// servers, each with a user part (a token, or user:password) and each
// optionally with its own scheme: "nats://a@h1:4222, nats://u:p@h2:4222".
func natsList(t string) string {
	scheme := schemeOf(t)
	_, start, ok := authority(t)
	if !ok {
		return unparsable(t)
	}
	rest := t[start:]
	if Suspect(t) {
		// An '@' past the end of the server list: a token or password
		// with an unencoded '/', '?' or '#' ended the list early, and what
		// follows would show its tail. Hide all up to the last '@', as
		// genericURL does.
		rest = Mask + rest[strings.LastIndexByte(rest, '@'):]
	}
	end := hostsEnd(rest, true)
	hosts, tail := rest[:end], rest[end:]
	servers := strings.Split(hosts, ",")
	for i, srv := range servers {
		srv = strings.TrimSpace(srv)
		prefix := ""
		if j := strings.Index(srv, "://"); j >= 0 {
			prefix, srv = strings.ToLower(srv[:j+3]), srv[j+3:]
		}
		if at := strings.LastIndexByte(srv, '@'); at >= 0 {
			user := srv[:at]
			if name, _, hasPass := strings.Cut(user, ":"); hasPass && !strings.Contains(user, "@") {
				srv = name + ":" + Mask + srv[at:]
			} else {
				srv = Mask + srv[at:]
			}
		} else if !hostPort(srv) {
			// No user part, and no host[:port] either: the head of a
			// password holding an unencoded ',' ("u:pa,ss@h" is the
			// servers "u:pa" and "ss@h").
			srv = Mask
		}
		servers[i] = prefix + srv
	}
	if q, frag, ok := strings.Cut(tail, "?"); ok {
		// The path and fragment are not secrets; the query may be.
		q2, fr, hasFrag := strings.Cut(frag, "#")
		tail = q + "?" + redactQuery(q2)
		if hasFrag {
			tail += "#" + fr
		}
	}
	return scheme + "://" + strings.Join(servers, ",") + tail
}

// Webhook returns an http:// or https:// URL as logs and errors show a
// webhook endpoint: scheme://host, and /xxxxx for a path, since a path can
// be the endpoint's secret (Slack's /services/T…/B…/<token>, Discord's
// /api/webhooks/<id>/<token>); no user, query or fragment. A URL that does
// not parse, or has no host, is "(invalid URL)". A URL with an '@' past
// its host (Suspect) is shown without its host either: "https://1234?x@h"
// and "https://u:1234/x@h" are read as host 1234 and port 1234, the head of
// credentials holding an unencoded '?' or '/'.
func Webhook(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" || u.Opaque != "" {
		return "(invalid URL)"
	}
	host := u.Host
	if Suspect(raw) {
		host = Mask
	}
	shown := u.Scheme + "://" + host
	if u.Path != "" && u.Path != "/" {
		shown += "/" + Mask
	}
	return shown
}

// hostPort reports whether s reads as a server address, host or
// host:port with a decimal port, as NATS reads one ("" included: "nats://"
// alone is refused by the parser, not hidden).
func hostPort(s string) bool {
	if s == "" {
		return true
	}
	u, err := url.Parse("nats://" + s)
	if err != nil || u.Host != s || u.User != nil {
		return false
	}
	_, err = strconv.ParseUint(u.Port(), 10, 16)
	return u.Port() == "" || err == nil
}

// bareName reports whether s is a name, not a URL: letters, digits, '.',
// '-' and '_' only (the demo's and chaos's "nats", "kafka", "webhook").
func bareName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func unparsable(raw string) string {
	if s := schemeOf(raw); s != "" {
		return s + "://(unparsable URL, not shown)"
	}
	return "(unparsable URL, not shown)"
}

// isURL reports whether a connection string is in URL form: it starts
// (after spaces, in any case) with postgres: or postgresql:, as pgx decides
// (the form without "//" is not one pgx reads, but it is one a password
// could sit in).
func isURL(s string) bool {
	switch schemeOf(strings.TrimSpace(s)) {
	case "postgres", "postgresql":
		return true
	}
	return false
}

// UnencodedAt reports whether a PostgreSQL URL's user part holds an
// unencoded '@' (more than one '@' before the host): pgx, like libpq, ends
// the user part at the first one and takes the rest of the password for
// the host, which its errors then quote.
func UnencodedAt(s string) bool {
	if !isURL(s) {
		return false
	}
	auth, _, ok := authority(strings.TrimSpace(s))
	return ok && strings.Count(auth, "@") > 1
}

// UnencodedSlash reports whether a PostgreSQL URL's password may hold an
// unencoded '/': pgx, like libpq, looks for the user part's '@' only up to
// the first '/', so it then sees no user part, takes the user name for the
// host, the password's head for the port and its tail for the database
// name or the query, and quotes them in its errors. It is told by an '@'
// after a '/' that comes before any '@'; a URL without a user part that
// holds an '@' in its path or query must then write it as %40.
func UnencodedSlash(s string) bool {
	if !isURL(s) {
		return false
	}
	t := strings.TrimSpace(s)
	_, start, ok := authority(t)
	if !ok {
		return false
	}
	rest := t[start:]
	i := strings.IndexAny(rest, "@/")
	return i >= 0 && rest[i] == '/' && strings.Contains(rest[i:], "@")
}

// Database returns a PostgreSQL connection string, in URL form
// (postgres://user:password@host/db?sslpassword=...) or key=value form
// (host=h password='p w' sslpassword=...), with its password and
// sslpassword (and any other secret parameter) replaced by Mask. A URL is
// recognised whatever the case of its scheme and spaces around it; one
// without "//" after the scheme, or that does not parse, is not shown. A
// key=value string with anything that is not key=value is not shown
// either.
func Database(s string) string {
	if isURL(s) {
		return genericURL(strings.TrimSpace(s))
	}
	if t := strings.TrimSpace(s); schemeOf(t) != "" {
		// "scheme:..." is no key=value string (a key has no ':'). Another
		// URL given as a database (a destination in the wrong flag) is
		// shown as URL shows it: read as key=value, a query's "x=1" made
		// it one pair, shown whole.
		if _, _, ok := authority(t); ok {
			return URL(t)
		}
		return "(malformed connection string, not shown)"
	}
	return keyValue(s)
}

// keyValue redacts a libpq key=value connection string; one with a part
// that is not key=value is not shown.
func keyValue(s string) string {
	var b strings.Builder
	last := 0
	malformed := false
	scanKeyValues(s, func(key string, from, to int) {
		if from < 0 {
			malformed = true
			return
		}
		if IsSecretKey(key) {
			b.WriteString(s[last:from])
			b.WriteString(Mask)
			last = to
		}
	})
	if malformed {
		return "(malformed connection string, not shown)"
	}
	b.WriteString(s[last:])
	return b.String()
}

// scanKeyValues calls fn with each key of a key=value connection string and
// where its value is in s (quotes included), or with from = -1 for a part
// that is not key=value. Values may be single-quoted, with \' and \\
// escapes; spaces may surround '='.
func scanKeyValues(s string, fn func(key string, from, to int)) {
	i := 0
	skip := func() {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
	}
	for {
		skip()
		if i >= len(s) {
			return
		}
		start := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[start:i]
		skip()
		if i >= len(s) || s[i] != '=' {
			if i == start {
				i++
			}
			fn(key, -1, -1) // malformed: pgx says so
			continue
		}
		i++
		skip()
		from := i
		quoted := i < len(s) && s[i] == '\''
		if quoted {
			i++
		}
		for i < len(s) && ((quoted && s[i] != '\'') || (!quoted && !isSpace(s[i]))) {
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			i++
		}
		if quoted && i < len(s) {
			i++ // the closing quote
		}
		fn(key, from, i)
	}
}

// unquote returns a key=value connection string's value as pgx reads it.
func unquote(v string) string {
	if strings.HasPrefix(v, "'") {
		v = strings.TrimSuffix(v[1:], "'")
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// Secrets returns text with every occurrence of each non-empty secret (as
// it is, and percent-encoded as it would be in a URL) replaced by Mask: for
// the error of a library that may quote what it was given. Secrets shorter
// than four bytes are left alone, as replacing them would mangle the text
// without hiding anything.
func Secrets(text string, secrets ...string) string {
	for _, sec := range secrets {
		if len(sec) < 4 {
			continue
		}
		for _, form := range []string{sec, url.PathEscape(sec), url.QueryEscape(sec)} {
			text = strings.ReplaceAll(text, form, Mask)
		}
	}
	return text
}

// DatabaseSecrets returns the password and sslpassword a PostgreSQL
// connection string holds (empty strings left out), for Secrets.
func DatabaseSecrets(s string) []string {
	var out []string
	add := func(v string) {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if isURL(s) {
		t := strings.TrimSpace(s)
		u, err := url.Parse(t)
		if err == nil {
			if pw, ok := u.User.Password(); ok {
				add(pw)
			}
		}
		// Whatever else a parser could take for the password: between
		// "user:" and the last '@' of the authority (as net/url reads it),
		// between "user:" and the first '@' (as pgx and libpq read it), and
		// what follows an '@' in the user part, which those then take for
		// the host and quote in their errors.
		auth, _, ok := authority(t)
		if !ok {
			_, auth, _ = strings.Cut(t, ":")
			auth = strings.TrimLeft(auth, "/")
			if i := strings.IndexAny(auth, "/?#"); i >= 0 && strings.LastIndex(auth[:i], "@") < 0 {
				auth = auth[:i]
			}
		}
		addBoth := func(v string) {
			add(v)
			if dec, err := url.PathUnescape(v); err == nil {
				add(dec)
			}
		}
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			userinfo := auth[:at]
			_, pw, hasPW := strings.Cut(userinfo, ":")
			if err != nil && hasPW {
				add(pw)
			}
			if strings.Contains(userinfo, "@") {
				if hasPW {
					addBoth(strings.SplitN(pw, "@", 2)[0])
				}
				for tail := userinfo; strings.Contains(tail, "@"); {
					_, tail, _ = strings.Cut(tail, "@")
					addBoth(tail)
				}
			}
		}
		if err == nil {
			for k, vs := range u.Query() {
				if IsSecretKey(k) {
					for _, v := range vs {
						add(v)
					}
				}
			}
		}
		return out
	}
	scanKeyValues(s, func(key string, from, to int) {
		if IsSecretKey(key) {
			add(unquote(s[from:to]))
		}
	})
	return out
}

// Error returns err with Secrets applied to its message; errors.Is and
// errors.As still see err. A nil err stays nil.
func Error(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := Secrets(err.Error(), secrets...)
	if msg == err.Error() {
		return err
	}
	return &redacted{err: err, msg: msg}
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// urlInText finds http:// and https:// URLs in free text.
var urlInText = regexp.MustCompile(`(?i)\bhttps?://[^\s"'<>]+`)

// Text returns free text (an error, an event's last_error) with every
// http:// or https:// URL in it shown as Webhook shows it, so that an
// endpoint's path or query token recorded by an older version is not shown.
func Text(s string) string {
	if !strings.Contains(strings.ToLower(s), "http") {
		return s
	}
	return urlInText.ReplaceAllStringFunc(s, func(u string) string {
		trimmed := strings.TrimRight(u, ".,;:!?)]}")
		return Webhook(trimmed) + u[len(trimmed):]
	})
}
