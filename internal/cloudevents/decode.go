package cloudevents

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// SpecVersion is the CloudEvents version every binding writes and reads.
const SpecVersion = "1.0"

// Binding is what DecodeAttributes needs to know of a protocol binding.
type Binding struct {
	// Kind and Prefix spell an attribute in errors as the binding carries
	// it: Kind "header" and Prefix "ce_" name the id "header ce_id"; Kind
	// "property" and Prefix "cloudEvents:" name it "property cloudEvents:id".
	Kind, Prefix string
	// Unescape, when not nil, decodes the values of the string attributes
	// (type, source, subject, aggregatetype) as the binding encodes them:
	// DecodeValue for the HTTP and NATS bindings. It fails on a value it
	// cannot decode or that does not decode to UTF-8. A binding without
	// Unescape must itself refuse values that are not UTF-8.
	Unescape func(string) (string, error)
}

// Name is the attribute's name in errors: "header ce_id".
func (b Binding) Name(attr string) string { return b.Kind + " " + b.Prefix + attr }

// Lookup returns the value of the attribute with the given CloudEvents name,
// unprefixed and lower-case ("specversion", "id", "type", "source",
// "subject", "time", "aggregatetype", "sequence", "schemaversion",
// "skippedfrom", "replayid"). ok is false when the message does not carry
// it. A non-nil err means the message carries it but the binding cannot
// read it as one string (repeated, not a string): DecodeAttributes reports
// it after the attribute's name ("header ce-id" + " " + "appears more than
// once") and does not read the value.
type Lookup func(name string) (value string, ok bool, err error)

// DecodeAttributes fills the fields of an outbox.Message that the
// CloudEvents attributes carry (ID, Type, AggregateType, AggregateID,
// Sequence, SchemaVersion, OccurredAt in UTC, SkippedFrom, ReplayID) and
// returns every attribute that is missing or malformed, each error naming
// the attribute as the binding does. The rules, the same for every binding:
// specversion, id, type, source, subject, time, aggregatetype, sequence and
// schemaversion are required; specversion is SpecVersion; id and replayid
// are UUIDs in canonical form (ParseID), replayid not the nil UUID; type,
// source and aggregatetype are not empty (subject, the aggregate id, may
// be); sequence, schemaversion and skippedfrom are ParsePositive numbers,
// schemaversion at most MaxInt32 and skippedfrom below sequence; time is
// RFC 3339. The message is only meaningful when no error is returned; the
// binding decodes the content type, payload and headers itself.
func DecodeAttributes(get Lookup, b Binding) (outbox.Message, []error) {
	var m outbox.Message
	var errs []error
	fail := func(attr string, err error) { errs = append(errs, fmt.Errorf("%s: %w", b.Name(attr), err)) }
	value := func(attr string, required bool) (string, bool) {
		v, ok, err := get(attr)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s %w", b.Name(attr), err))
			return "", false
		case !ok && required:
			errs = append(errs, fmt.Errorf("missing %s", b.Name(attr)))
		}
		return v, ok
	}
	text := func(attr string, empty bool) string {
		v, ok := value(attr, true)
		if !ok {
			return ""
		}
		if b.Unescape != nil {
			s, err := b.Unescape(v)
			if err != nil {
				fail(attr, err)
				return ""
			}
			v = s
		}
		if v == "" && !empty {
			errs = append(errs, fmt.Errorf("%s is empty", b.Name(attr)))
		}
		return v
	}
	parse := func(attr string, required bool, f func(string) error) {
		if v, ok := value(attr, required); ok {
			if err := f(v); err != nil {
				fail(attr, err)
			}
		}
	}
	parse("specversion", true, func(v string) error {
		if v != SpecVersion {
			return fmt.Errorf("unsupported CloudEvents version %q", v)
		}
		return nil
	})
	parse("id", true, func(v string) (err error) {
		m.ID, err = ParseID(v)
		return err
	})
	m.Type = text("type", false)
	m.AggregateType = text("aggregatetype", false)
	m.AggregateID = text("subject", true) // an empty aggregate id is allowed
	text("source", false)                 // required by CloudEvents; not part of the Message
	parse("sequence", true, func(v string) (err error) {
		m.Sequence, err = ParsePositive(v)
		return err
	})
	parse("schemaversion", true, func(v string) error {
		n, err := ParsePositive(v)
		if err == nil && n > math.MaxInt32 {
			err = fmt.Errorf("%q is out of range", v)
		}
		m.SchemaVersion = int(n)
		return err
	})
	parse("time", true, func(v string) error {
		t, err := time.Parse(time.RFC3339Nano, v)
		m.OccurredAt = t.UTC()
		return err
	})
	parse("skippedfrom", false, func(v string) error {
		n, err := ParsePositive(v)
		if err != nil || (m.Sequence > 0 && n >= m.Sequence) {
			return fmt.Errorf("%q is not a sequence below %d", v, m.Sequence)
		}
		m.SkippedFrom = n
		return nil
	})
	parse("replayid", false, func(v string) error {
		id, err := ParseID(v)
		if err == nil && id == uuid.Nil {
			err = errors.New("the nil UUID is not a replay id")
		}
		m.ReplayID = id
		return err
	})
	return m, errs
}
