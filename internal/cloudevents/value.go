package cloudevents

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

const hexDigits = "0123456789ABCDEF"

// EncodeValue percent-encodes a string attribute for a header value as the
// CloudEvents HTTP binding does (and the NATS binding follows): space, '"',
// '%' and every byte outside printable ASCII become %XX, so that any UTF-8
// string survives a header line exactly.
func EncodeValue(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEncoding(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEncoding(c) {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xF])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func needsEncoding(c byte) bool { return c <= ' ' || c >= 0x7F || c == '"' || c == '%' }

// DecodeValue reverses EncodeValue (hex digits in either case). It fails on
// a malformed %XX and when the result is not UTF-8.
func DecodeValue(s string) (string, error) {
	if !strings.Contains(s, "%") {
		if !utf8.ValidString(s) {
			return "", fmt.Errorf("%q is not UTF-8", s)
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return "", fmt.Errorf("invalid percent-encoding in %q", s)
		}
		b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
		i += 2
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%q does not decode to UTF-8", s)
	}
	return string(b), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
