// Package redact hides secrets in what the binaries print: connection
// strings (PostgreSQL URLs and key=value strings), destination URLs, and
// known secret values inside arbitrary text such as a library's error.
// Every binary and the console use it, so that a password, token or signing
// secret shows up as Mask in logs, errors, --help and status output, and
// nowhere else.
package redact

import (
	"net/url"
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
// tls:// URL, where it is a token. A URL that does not parse is not shown:
// the result is its scheme and a note.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return unparsable(raw)
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else if u.Scheme == "nats" || u.Scheme == "tls" {
			u.User = url.User(Mask)
		}
	}
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, p := range parts {
			k, _, _ := strings.Cut(p, "=")
			name, err := url.QueryUnescape(k)
			if err != nil {
				parts[i] = "(not shown)"
			} else if IsSecretKey(name) {
				parts[i] = k + "=" + Mask
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	return u.String()
}

func unparsable(raw string) string {
	if scheme, _, ok := strings.Cut(raw, "://"); ok && !strings.ContainsAny(scheme, "@:/ ") {
		return scheme + "://(unparsable URL, not shown)"
	}
	return "(unparsable URL, not shown)"
}

// Database returns a PostgreSQL connection string, in URL form
// (postgres://user:password@host/db?sslpassword=...) or key=value form
// (host=h password='p w' sslpassword=...), with its password and
// sslpassword (and any other secret parameter) replaced by Mask.
func Database(s string) string {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		return URL(s)
	}
	return keyValue(s)
}

// keyValue redacts a libpq key=value connection string.
func keyValue(s string) string {
	var b strings.Builder
	last := 0
	scanKeyValues(s, func(key string, from, to int) {
		if IsSecretKey(key) {
			b.WriteString(s[last:from])
			b.WriteString(Mask)
			last = to
		}
	})
	b.WriteString(s[last:])
	return b.String()
}

// scanKeyValues calls fn with each key of a key=value connection string and
// where its value is in s (quotes included). Values may be single-quoted,
// with \' and \\ escapes; spaces may surround '='.
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
			continue // malformed: pgx says so
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
		if v != "" {
			out = append(out, v)
		}
	}
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			// Whatever sits between "user:" and the last '@' of the
			// authority would be the password.
			_, rest, _ := strings.Cut(s, "://")
			if i := strings.IndexAny(rest, "/?"); i >= 0 && strings.LastIndex(rest[:i], "@") < 0 {
				rest = rest[:i]
			}
			if at := strings.LastIndex(rest, "@"); at >= 0 {
				if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
					add(pw)
				}
			}
			return out
		}
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
		for k, vs := range u.Query() {
			if IsSecretKey(k) {
				for _, v := range vs {
					add(v)
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
