// Package pgtext makes a Go string storable in a PostgreSQL text column.
//
// PostgreSQL's text refuses a NUL byte and bytes that are not valid in the
// database's encoding (UTF-8): a statement given such a parameter fails
// with SQLSTATE 22021. Error texts come from anywhere (a provider's body
// echoed in an error, a driver, a broker), so each one recorded goes
// through Clean.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Clean returns s with each byte sequence that is not UTF-8 and each NUL
// replaced by U+FFFD, cut to at most max bytes on a character boundary
// (max <= 0: not cut).
func Clean(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if max > 0 && len(s) > max {
		n := max
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return s
}
