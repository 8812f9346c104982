// Package cloudevents holds what every destination's CloudEvents binding of
// an outbox.Message (outboxnats, outboxkafka, outboxamqp, outboxwebhook)
// shares in decoding, so that a message one binding refuses is refused by
// all: DecodeAttributes, which reads the attributes from a binding's
// lookup and applies the one set of rules (required attributes, ParseID,
// ParsePositive, ...), naming the attributes in errors as the binding
// spells them; and the percent-encoding of string attributes of the HTTP
// binding (EncodeValue, DecodeValue), which the NATS binding follows. What
// differs between bindings stays in their codecs: where the attributes
// are, the content type, the payload and the message's own headers.
package cloudevents

import (
	"fmt"
	"strconv"

	"github.com/google/uuid"
)

// ParseID parses an event id in the canonical 36-character form only
// (uuid.Parse also takes urn:uuid:, braces and no dashes, which would let
// two spellings of one id through).
func ParseID(v string) (uuid.UUID, error) {
	if len(v) != 36 {
		return uuid.Nil, fmt.Errorf("%q is not a UUID in its canonical form", v)
	}
	return uuid.Parse(v)
}

// ParsePositive parses a decimal number of at least 1, digits only (no sign,
// no spaces): sequences, schema versions, skipped-from.
func ParsePositive(v string) (int64, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("%q is not a positive decimal number", v)
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a positive decimal number", v)
	}
	return n, nil
}
