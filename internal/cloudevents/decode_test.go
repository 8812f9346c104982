package cloudevents

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func goodAttrs() map[string]string {
	return map[string]string{
		"specversion": "1.0", "id": "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "type": "OrderCreated",
		"source": "/outbox", "subject": "o%201", "time": "2026-12-01T10:00:00.5+01:00",
		"aggregatetype": "order", "sequence": "00000000000000000007", "schemaversion": "2",
	}
}

func decode(attrs map[string]string, b Binding) ([]error, func(string) bool) {
	_, errs := DecodeAttributes(func(name string) (string, bool, error) {
		v, ok := attrs[name]
		if v == "REPEATED" {
			return "", true, errors.New("appears more than once")
		}
		return v, ok, nil
	}, b)
	return errs, func(s string) bool { return strings.Contains(errors.Join(errs...).Error(), s) }
}

// TestDecodeAttributes: the fields the attributes carry, percent-decoded
// only where the binding says and only for string attributes.
func TestDecodeAttributes(t *testing.T) {
	attrs := goodAttrs()
	attrs["skippedfrom"] = "3"
	attrs["replayid"] = "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6f"
	b := Binding{Kind: "header", Prefix: "ce-", Unescape: DecodeValue}
	m, errs := DecodeAttributes(func(name string) (string, bool, error) {
		v, ok := attrs[name]
		return v, ok, nil
	}, b)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if m.ID.String() != attrs["id"] || m.Type != "OrderCreated" || m.AggregateType != "order" || m.AggregateID != "o 1" ||
		m.Sequence != 7 || m.SchemaVersion != 2 || m.SkippedFrom != 3 || m.ReplayID.String() != attrs["replayid"] ||
		!m.OccurredAt.Equal(time.Date(2026, 12, 1, 9, 0, 0, 5e8, time.UTC)) || m.OccurredAt.Location() != time.UTC {
		t.Fatalf("decoded %+v", m)
	}
	// Without Unescape the value is taken as it is.
	m, _ = DecodeAttributes(func(name string) (string, bool, error) { v, ok := attrs[name]; return v, ok, nil }, Binding{Kind: "header", Prefix: "ce_"})
	if m.AggregateID != "o%201" {
		t.Fatalf("AggregateID without Unescape = %q", m.AggregateID)
	}
}

// TestDecodeAttributesRejects: the shared rules, each error naming the
// attribute as the binding spells it.
func TestDecodeAttributesRejects(t *testing.T) {
	b := Binding{Kind: "property", Prefix: "cloudEvents:", Unescape: DecodeValue}
	if errs, _ := decode(goodAttrs(), b); len(errs) > 0 {
		t.Fatalf("the good attributes: %v", errs)
	}
	for _, tc := range []struct{ attr, value, want string }{
		{"specversion", "", "missing property cloudEvents:specversion"},
		{"id", "", "missing property cloudEvents:id"},
		{"type", "", "missing property cloudEvents:type"},
		{"source", "", "missing property cloudEvents:source"},
		{"subject", "", "missing property cloudEvents:subject"},
		{"time", "", "missing property cloudEvents:time"},
		{"aggregatetype", "", "missing property cloudEvents:aggregatetype"},
		{"sequence", "", "missing property cloudEvents:sequence"},
		{"schemaversion", "", "missing property cloudEvents:schemaversion"},
		{"specversion", "0.3", "property cloudEvents:specversion: unsupported"},
		{"id", "{0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e}", "property cloudEvents:id:"},
		{"id", "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6%65", "property cloudEvents:id:"}, // not unescaped
		{"type", "EMPTY", "property cloudEvents:type is empty"},
		{"aggregatetype", "EMPTY", "property cloudEvents:aggregatetype is empty"},
		{"source", "EMPTY", "property cloudEvents:source is empty"},
		{"type", "bad%zz", "property cloudEvents:type: invalid percent-encoding"},
		{"subject", "%FF", "property cloudEvents:subject:"},
		{"time", "yesterday", "property cloudEvents:time:"},
		{"sequence", "0", "property cloudEvents:sequence:"},
		{"schemaversion", "4294967296", "property cloudEvents:schemaversion:"},
		{"skippedfrom", "7", "property cloudEvents:skippedfrom:"},
		{"skippedfrom", "+1", "property cloudEvents:skippedfrom:"},
		{"replayid", "00000000-0000-0000-0000-000000000000", "property cloudEvents:replayid: the nil UUID"},
		{"replayid", "urn:uuid:0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "property cloudEvents:replayid:"},
		{"id", "REPEATED", "property cloudEvents:id appears more than once"},
	} {
		attrs := goodAttrs()
		switch tc.value {
		case "":
			delete(attrs, tc.attr)
		case "EMPTY":
			attrs[tc.attr] = ""
		default:
			attrs[tc.attr] = tc.value
		}
		errs, has := decode(attrs, b)
		if len(errs) != 1 || !has(tc.want) {
			t.Errorf("%s = %q: errors %v, want one with %q", tc.attr, tc.value, errs, tc.want)
		}
	}
	// An empty subject (aggregate id) is allowed.
	attrs := goodAttrs()
	attrs["subject"] = ""
	if errs, _ := decode(attrs, b); len(errs) > 0 {
		t.Errorf("empty subject: %v", errs)
	}
}
