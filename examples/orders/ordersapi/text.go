package ordersapi

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// fieldProblem is why one field of a request is refused.
type fieldProblem struct {
	// Field names the field as the client wrote it: "customer_id",
	// "items[2].sku", "Idempotency-Key", "{id}" (the order id in the path).
	Field string
	// Reason completes the sentence "<Field> <Reason>".
	Reason string
	// Malformed is true when the value is not text the API can store at all
	// (a 400), false when it is text that breaks a rule of the API (too long,
	// missing: a 422).
	Malformed bool
}

func (p *fieldProblem) String() string { return p.Field + " " + p.Reason }

// checkText is the one check every string that comes from a client passes
// before it reaches PostgreSQL (as a value to store or to look up): the body's
// customer_id and SKUs, the Idempotency-Key header and the order id in the
// path. It returns nil when s is acceptable as field.
//
// A PostgreSQL text value cannot hold invalid UTF-8 or a NUL character: sent
// as parameters they fail the statement ("invalid byte sequence for encoding
// UTF8"), and in the event's jsonb payload a NUL fails as "unsupported Unicode
// escape sequence". They are malformed input, refused before any statement.
//
// So is U+FFFD, the replacement character. encoding/json does not refuse
// invalid UTF-8 in a body or a lone surrogate escape such as "\ud800"; it
// decodes both as U+FFFD, so the order would silently store a value other
// than the one the client sent, and two different ids would become the same
// one. Every string the API takes is an identifier, where U+FFFD can only be
// the trace of text already lost, so it is refused too.
//
// Then the value must be non-empty and at most maxLen bytes: breaking those
// rules is a validation failure of well-formed text, not malformed input.
func checkText(field, s string, maxLen int) *fieldProblem {
	malformed := func(reason string) *fieldProblem { return &fieldProblem{Field: field, Reason: reason, Malformed: true} }
	switch {
	case !utf8.ValidString(s):
		return malformed("is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return malformed("contains a NUL character (U+0000), which PostgreSQL text cannot store")
	case strings.ContainsRune(s, utf8.RuneError):
		return malformed("contains U+FFFD, the replacement for invalid UTF-8 or a lone surrogate escape such as \\ud800")
	case s == "":
		return &fieldProblem{Field: field, Reason: "is required"}
	case len(s) > maxLen:
		return &fieldProblem{Field: field, Reason: fmt.Sprintf("is longer than %d bytes", maxLen)}
	}
	return nil
}

// refuseFields builds the error for a request with the given problems (at
// least one): Malformed when any value is malformed, listed first so that the
// detail names a malformed field, else Invalid. Detail states the first
// problem; Errors lists all of them when there are several.
func refuseFields(problems []*fieldProblem) *Error {
	problems = slices.Clone(problems)
	slices.SortStableFunc(problems, func(a, b *fieldProblem) int {
		switch {
		case a.Malformed == b.Malformed:
			return 0
		case a.Malformed:
			return -1
		}
		return 1
	})
	kind := Invalid
	if problems[0].Malformed {
		kind = Malformed
	}
	e := refuse(kind, "%s", problems[0])
	if len(problems) > 1 {
		e.Detail = fmt.Sprintf("%s (and %d more)", problems[0], len(problems)-1)
		e.Errors = make([]string, len(problems))
		for i, p := range problems {
			e.Errors[i] = p.String()
		}
	}
	return e
}
