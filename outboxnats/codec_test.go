package outboxnats_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox/outboxnats"
)

// TestDecodeRefusesRepeatedAttributes: a ce- header with two values, or
// spelled twice in different case, is refused, as the other codecs refuse
// a repeated attribute, rather than one of the values being picked.
func TestDecodeRefusesRepeatedAttributes(t *testing.T) {
	t.Parallel()
	full := func() nats.Header {
		return nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {"6f1c2f9e-8a58-4b8e-9c07-5f4c8f7f2a11"}, "ce-type": {"OrderCreated"},
			"ce-source": {"/outbox"}, "ce-subject": {"o-1"}, "ce-time": {"2026-03-14T15:09:26Z"},
			"ce-aggregatetype": {"order"}, "ce-sequence": {"2"}, "ce-schemaversion": {"1"},
			"content-type": {"application/json"}, "Nats-Msg-Id": {"6f1c2f9e-8a58-4b8e-9c07-5f4c8f7f2a11"},
		}
	}
	if _, err := outboxnats.Decode(full(), nil); err != nil {
		t.Fatalf("the well-formed header: %v", err)
	}
	h := full()
	delete(h, "ce-type")
	h["Ce-Type"] = []string{"OrderCreated"}
	if _, err := outboxnats.Decode(h, nil); err != nil {
		t.Fatalf("one mixed-case name: %v", err)
	}
	for name, change := range map[string]func(nats.Header){
		"two values":             func(h nats.Header) { h["ce-type"] = append(h["ce-type"], "OrderPaid") },
		"two spellings":          func(h nats.Header) { h["CE-TYPE"] = []string{"OrderCreated"} },
		"two content types":      func(h nats.Header) { h["Content-Type"] = []string{"text/plain"} },
		"two values, mixed case": func(h nats.Header) { delete(h, "ce-type"); h["Ce-Type"] = []string{"A", "B"} },
	} {
		h := full()
		change(h)
		_, err := outboxnats.Decode(h, nil)
		if err == nil || !strings.Contains(err.Error(), "appears more than once") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
