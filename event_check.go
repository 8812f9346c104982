package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"
)

// The checks below decide what an Event may hold. They refuse, before
// anything reaches PostgreSQL, every value the database would refuse (and so
// abort the caller's transaction with): invalid UTF-8 and NUL in text, and
// \u0000 or an unpaired surrogate in a JSON document. They also refuse what
// a destination could not carry back unchanged, so that an accepted event
// reaches consumers exactly as written.

// checkText checks a required text field: present, at most max bytes, valid
// UTF-8, no control characters.
func checkText(field, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is empty", field)
	case len(s) > max:
		return fmt.Errorf("%s is %d bytes, over the %d-byte limit", field, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", field)
	}
	if i := controlChar(s); i >= 0 {
		return fmt.Errorf("%s has a control character (%U) at byte %d", field, rune(s[i]), i)
	}
	return nil
}

// controlChar returns the index of the first C0 control character or DEL in
// s, or -1.
func controlChar(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7F {
			return i
		}
	}
	return -1
}

// checkContentType checks a non-empty content type and reports whether it
// names JSON.
func checkContentType(ct string) (isJSON bool, err error) {
	if len(ct) > MaxNameBytes {
		return false, fmt.Errorf("content type is %d bytes, over the %d-byte limit", len(ct), MaxNameBytes)
	}
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; c < 0x20 || c >= 0x7F {
			return false, fmt.Errorf("content type %q is not printable ASCII", ct)
		}
	}
	mediaType, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false, fmt.Errorf("content type %q: %v", ct, err)
	}
	return IsJSONContentType(mediaType), nil
}

// IsJSONContentType reports whether a media type (without parameters) is
// JSON: application/json or a structured-syntax "+json" type.
func IsJSONContentType(mediaType string) bool {
	mediaType = strings.ToLower(mediaType)
	return mediaType == ContentTypeJSON || strings.HasSuffix(mediaType, "+json")
}

// checkJSON checks that b is one JSON document that jsonb could store too.
func checkJSON(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("not valid UTF-8")
	}
	if !json.Valid(b) {
		return errors.New("not valid JSON")
	}
	return checkEscapes(b)
}

// checkEscapes refuses the \u escapes PostgreSQL's jsonb cannot hold: \u0000
// and a surrogate that is not part of a pair. b is valid JSON, so every
// backslash is inside a string and starts a well-formed escape.
func checkEscapes(b []byte) error {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if b[i+1] != 'u' {
			i++ // \" \\ \/ \b \f \n \r \t
			continue
		}
		r := hex4(b[i+2 : i+6])
		switch {
		case r == 0:
			return fmt.Errorf(`\u0000 at byte %d (PostgreSQL cannot store it)`, i)
		case r >= 0xD800 && r <= 0xDBFF:
			if i+12 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
				return fmt.Errorf("unpaired surrogate \\u%04X at byte %d", r, i)
			}
			if lo := hex4(b[i+8 : i+12]); lo < 0xDC00 || lo > 0xDFFF {
				return fmt.Errorf("unpaired surrogate \\u%04X at byte %d", r, i)
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return fmt.Errorf("unpaired surrogate \\u%04X at byte %d", r, i)
		default:
			i += 5
		}
	}
	return nil
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// reservedHeaderPrefixes and reservedHeaderNames are the header names the
// destinations set themselves (CloudEvents attributes in each protocol's
// binding, broker and webhook headers). A caller's header of that name
// would be overwritten or dropped on the way, so it is refused.
var (
	reservedHeaderPrefixes = []string{"ce-", "ce_", "nats-", "webhook-", "cloudevents:"}
	reservedHeaderNames    = []string{"content-type", "idempotency-key"}
)

// checkHeader checks one header.
func checkHeader(k, v string) error {
	switch {
	case k == "":
		return errors.New("header with an empty name")
	case len(k) > MaxNameBytes:
		return fmt.Errorf("header name is %d bytes, over the %d-byte limit", len(k), MaxNameBytes)
	}
	for i := 0; i < len(k); i++ {
		if !tokenChar(k[i]) {
			return fmt.Errorf("header name %q: byte %d is not allowed in a header name", k, i)
		}
	}
	lk := strings.ToLower(k)
	for _, p := range reservedHeaderPrefixes {
		if strings.HasPrefix(lk, p) {
			return fmt.Errorf("header name %q is reserved (%s* is set by the destinations)", k, p)
		}
	}
	for _, n := range reservedHeaderNames {
		if lk == n {
			return fmt.Errorf("header name %q is reserved (set by the destinations)", k)
		}
	}
	switch {
	case len(v) > MaxHeaderValueBytes:
		return fmt.Errorf("header %s: value is %d bytes, over the %d-byte limit", k, len(v), MaxHeaderValueBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("header %s: value is not valid UTF-8", k)
	case strings.TrimSpace(v) != v:
		return fmt.Errorf("header %s: value has leading or trailing white space", k)
	}
	if i := controlChar(v); i >= 0 {
		return fmt.Errorf("header %s: value has a control character (%U) at byte %d", k, rune(v[i]), i)
	}
	return nil
}

// tokenChar reports whether c may appear in an HTTP token (RFC 9110), the
// syntax of a header name that every destination accepts.
func tokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
