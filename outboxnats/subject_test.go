package outboxnats_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/outboxnats"
)

var weird = []string{
	"", "a", "A", "o-42", "o_42", "order.42", "a.b", "a%2Eb", "%", "%%", "*", ">", "a.>", "a.*.b",
	" ", "a b", "\t", "a\nb", "\r\n", "\x00", "\x7f", "é", "日本語", "🙂", "$JS", "a/b", "a:b",
	`"quoted"`, "%41", "A%", "..", ".", "-", "_", "a-b_c", strings.Repeat("x", 300), "\xff\xfe",
}

var validToken = regexp.MustCompile(`^(%|([A-Za-z0-9_-]|%[0-9A-F]{2})+)$`)

func TestSubjectEscaping(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ typ, id, want string }{
		{"order", "o-42", "outbox.order.o-42"},
		{"order", "a.b", "outbox.order.a%2Eb"},
		{"order", "*", "outbox.order.%2A"},
		{"order", ">", "outbox.order.%3E"},
		{"order", "a b", "outbox.order.a%20b"},
		{"order", "50%", "outbox.order.50%25"},
		{"order", "é", "outbox.order.%C3%A9"},
		{"", "", "outbox.%.%"},
		{"Order_Line", "x-1_2", "outbox.Order_Line.x-1_2"},
	} {
		if got := outboxnats.Subject("outbox", c.typ, c.id); got != c.want {
			t.Errorf("Subject(outbox, %q, %q) = %q, want %q", c.typ, c.id, got, c.want)
		}
	}

	seen := map[string][2]string{}
	for _, prefix := range []string{"outbox", "app.events"} {
		clear(seen)
		for _, typ := range weird {
			for _, id := range weird {
				s := outboxnats.Subject(prefix, typ, id)
				if prev, dup := seen[s]; dup {
					t.Fatalf("Subject not injective: (%q, %q) and (%q, %q) both give %q", prev[0], prev[1], typ, id, s)
				}
				seen[s] = [2]string{typ, id}
				checkSubject(t, prefix, s)
				gotTyp, gotID, err := outboxnats.ParseSubject(prefix, s)
				if err != nil || gotTyp != typ || gotID != id {
					t.Fatalf("ParseSubject(%q) = %q, %q, %v; want %q, %q", s, gotTyp, gotID, err, typ, id)
				}
			}
		}
	}
}

// checkSubject checks that s is a valid literal NATS subject with exactly
// two tokens after prefix.
func checkSubject(t *testing.T, prefix, s string) {
	t.Helper()
	if strings.ContainsAny(s, " \t\r\n") {
		t.Fatalf("subject %q contains whitespace", s)
	}
	toks := strings.Split(s, ".")
	ptoks := strings.Split(prefix, ".")
	if len(toks) != len(ptoks)+2 {
		t.Fatalf("subject %q has %d tokens, want %d", s, len(toks), len(ptoks)+2)
	}
	for _, tok := range toks[len(ptoks):] {
		if tok == "" || tok == "*" || tok == ">" || !validToken.MatchString(tok) {
			t.Fatalf("subject %q has invalid token %q", s, tok)
		}
	}
}

func TestAggregateTypeFilter(t *testing.T) {
	t.Parallel()
	if got, want := outboxnats.AggregateTypeFilter("outbox", "order.line"), "outbox.order%2Eline.>"; got != want {
		t.Errorf("AggregateTypeFilter = %q, want %q", got, want)
	}
}

func TestParseSubjectRejects(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"other.order.1", "outbox.order", "outbox.order.1.2", "outbox.order.%2", "outbox.order.%2e",
		"outbox.order.%41", "outbox.order.", "outbox..1", "outbox.order.a b",
	} {
		if typ, id, err := outboxnats.ParseSubject("outbox", s); err == nil {
			t.Errorf("ParseSubject(%q) = %q, %q, nil; want an error", s, typ, id)
		}
	}
}

func FuzzSubject(f *testing.F) {
	for _, s := range weird {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, typ, id string) {
		s := outboxnats.Subject("p.q", typ, id)
		checkSubject(t, "p.q", s)
		gotTyp, gotID, err := outboxnats.ParseSubject("p.q", s)
		if err != nil || gotTyp != typ || gotID != id {
			t.Fatalf("ParseSubject(%q) = %q, %q, %v; want %q, %q", s, gotTyp, gotID, err, typ, id)
		}
	})
}
