package redact

import (
	"errors"
	"strconv"
	"strings"
)

// What a URL parser's error may show. A destination URL's parser (outboxnats,
// outboxkafka, outboxamqp, outboxwebhook) and the database URL's check use
// these, so that one rule holds for all of them:
//
//   - a URL whose password or token may have spilled into another part
//     (Suspect) gets an error that shows none of the URL;
//   - otherwise the error shows the URL as URL redacts it, and names the
//     parameter and what is wrong with it, never its value (Param).

// Suspect reports whether a password or token of raw may sit where a
// parser takes it for something else: an '@' after the end of the host
// part (the first '/', '?' or '#' after "://"), which is what an unencoded
// '/', '?' or '#' in a password or token looks like (a parser reads its
// head as host and port, its tail as path, query or fragment, and its
// errors quote them); or a string with an '@' and no "scheme://" at all. In
// a nats:// or tls:// server list a server's own "scheme://" does not end
// the host part. An '@' in a genuine path or query makes a URL suspect too:
// never less, sometimes more.
func Suspect(raw string) bool {
	t := strings.TrimSpace(raw)
	_, start, ok := authority(t)
	if !ok {
		return strings.Contains(t, "@")
	}
	end := start + hostsEnd(t[start:], isNATS(t))
	return strings.Contains(t[end:], "@")
}

// isNATS reports whether a URL's scheme is nats or tls, whose host part
// may list several servers, each with its own "scheme://".
func isNATS(t string) bool {
	switch schemeOf(t) {
	case "nats", "tls":
		return true
	}
	return false
}

// hostsEnd returns where the host part of rest (what follows "scheme://")
// ends: at its first '/', '?' or '#', a server's own "://" skipped when
// list is set.
func hostsEnd(rest string, list bool) int {
	for i := 0; i < len(rest); i++ {
		if list && strings.HasPrefix(rest[i:], "://") {
			i += 2
			continue
		}
		if strings.IndexByte("/?#", rest[i]) >= 0 {
			return i
		}
	}
	return len(rest)
}

// Scheme returns the scheme of raw for an error message: as written when it
// is a scheme (letters, digits, '+', '-', '.'), and "(none)" otherwise; the
// text before a "://" that is not a scheme is no place for a secret, but it
// is not shown either.
func Scheme(raw string) string {
	if s := schemeOf(strings.TrimSpace(raw)); s != "" {
		return s
	}
	return "(none)"
}

// Param returns an error about the query parameter key whose value v was
// refused for err: "key: what err says", with v taken out of err's text
// (a validator's message may quote the value, and the value may be
// anything, a misplaced secret included). A key that is not a plain name
// (letters, digits, '_', '-', '.', at most 64 bytes) is not shown either.
func Param(key, v string, err error) error {
	msg := err.Error()
	if v != "" {
		msg = strings.ReplaceAll(msg, strconv.Quote(v), "(value not shown)")
		if len(v) >= 4 {
			msg = strings.ReplaceAll(msg, v, "(value not shown)")
		}
	}
	return errors.New(ParamName(key) + ": " + msg)
}

// ParamName returns a query parameter's name as an error may show it: as
// written when it is a plain name (letters, digits, '_', '-', '.', at most
// 64 bytes), and "a parameter whose name is not shown" otherwise.
func ParamName(key string) string {
	if key == "" || len(key) > 64 || !bareName(key) {
		return "a parameter whose name is not shown"
	}
	return key
}
