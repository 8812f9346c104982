package pgtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 0, "plain"},
		{"a\x00b", 0, "a\uFFFDb"},
		{"caf\xe9", 0, "caf\uFFFD"},
		{"abé", 3, "ab"},
		{"abé", 4, "abé"},
		{"abc", 2, "ab"},
	} {
		if got := Clean(c.in, c.max); got != c.want {
			t.Errorf("Clean(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
	long := strings.Repeat("é", 1500)
	if got := Clean(long, 2001); !utf8.ValidString(got) || len(got) > 2001 {
		t.Errorf("Clean cut inside a character: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
