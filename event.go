package outbox

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
)

// Limits on an Event's fields. Every destination carries the aggregate id in
// a subject, record key, routing key or header, and the names in a subject
// token, topic or header; these limits keep all of them within what the
// brokers accept. The schema enforces the same limits with CHECK constraints,
// for rows written by other languages.
const (
	// MaxAggregateIDBytes is the longest aggregate id accepted, in bytes.
	MaxAggregateIDBytes = 512
	// MaxNameBytes is the longest aggregate type, event type or content
	// type accepted, in bytes.
	MaxNameBytes = 255
	// MaxHeaders is the most headers an event may carry.
	MaxHeaders = 64
	// MaxHeaderValueBytes is the longest header value accepted, in bytes.
	MaxHeaderValueBytes = 4096
)

// ContentTypeJSON is the content type of a payload whose Event.ContentType
// is empty.
const ContentTypeJSON = "application/json"

// Event is the intent to publish one event, recorded with Writer.InsertTx in
// the same transaction as the business change it describes.
//
// Every text field must be valid UTF-8 without control characters, within
// the limits above; anything else is refused with ErrInvalidEvent before a
// byte is sent to the database, so a bad event never aborts the caller's
// transaction.
type Event struct {
	// ID identifies the event everywhere: the outbox row, the broker message
	// (and the broker's dedup key), and the consumer's inbox. Leave it zero
	// and the writer assigns a UUIDv7.
	ID uuid.UUID
	// AggregateType names the kind of entity the event belongs to ("order").
	// Required, at most MaxNameBytes.
	AggregateType string
	// AggregateID identifies the entity ("ord-42"). Events of one aggregate
	// are published and applied in the order they were written. Required, at
	// most MaxAggregateIDBytes.
	AggregateID string
	// Type is the event type ("OrderCreated"). Required, at most
	// MaxNameBytes.
	Type string
	// SchemaVersion is the version of the payload's schema, 0 to
	// math.MaxInt32 (the column is an integer). Zero means 1.
	SchemaVersion int
	// ContentType is the payload's media type, carried to consumers as the
	// CloudEvents datacontenttype. Empty means ContentTypeJSON. For a JSON
	// type (application/json or any "+json" type) the payload must be one
	// valid JSON document that PostgreSQL's jsonb could also hold (no \u0000,
	// no unpaired surrogate escapes), so any consumer can store it; for any
	// other type ("application/protobuf", "application/avro") the payload is
	// opaque bytes and may be empty.
	ContentType string
	// Payload is the event body. It is stored and published byte for byte
	// as given, at most WriterConfig.MaxPayloadBytes.
	Payload []byte
	// Headers are extra metadata carried to the broker, for example the W3C
	// trace context ("traceparent", "tracestate"). Optional. Names are HTTP
	// tokens of at most MaxNameBytes (letters, digits and !#$%&'*+-.^_`|~),
	// and may not take a name the destinations reserve (ce-*, ce_*, nats-*,
	// webhook-*, content-type, idempotency-key); values are at most
	// MaxHeaderValueBytes of text without control characters or leading
	// and trailing spaces, since header lines trim and split on those.
	Headers map[string]string
}

// Recorded is what the writer stored for one Event.
type Recorded struct {
	// ID is the event id (assigned by the writer when the Event had none).
	ID uuid.UUID
	// Sequence is the event's aggregate_sequence: 1 for an aggregate's first
	// event, then consecutive.
	Sequence int64
	// OccurredAt is the event's occurred_at (the transaction's start time).
	OccurredAt time.Time
}

// ErrInvalidEvent is wrapped by every error about an Event that was refused
// before anything was written.
var ErrInvalidEvent = errors.New("invalid event")

func invalid(i int, format string, args ...any) error {
	return fmt.Errorf("%w %d: %s", ErrInvalidEvent, i, fmt.Sprintf(format, args...))
}

// Validate checks the event against the limits above and a writer's default
// MaxPayloadBytes, as InsertTx does, without a database: it returns nil, or
// an error wrapping ErrInvalidEvent that names the field.
func (ev Event) Validate() error {
	return ev.validate(0, MaxPayloadBytesDefault)
}

// validate checks ev (the i-th of a call) against the writer's limits. It is
// the only check on both write paths, so an event is refused or accepted
// identically whichever statement would have carried it.
func (ev *Event) validate(i int, maxPayload int) error {
	if err := checkText("aggregate type", ev.AggregateType, MaxNameBytes); err != nil {
		return invalid(i, "%v", err)
	}
	if err := checkText("aggregate id", ev.AggregateID, MaxAggregateIDBytes); err != nil {
		return invalid(i, "%v", err)
	}
	if err := checkText("event type", ev.Type, MaxNameBytes); err != nil {
		return invalid(i, "%v", err)
	}
	if ev.SchemaVersion < 0 {
		return invalid(i, "schema version %d is negative", ev.SchemaVersion)
	}
	if ev.SchemaVersion > math.MaxInt32 { // the column is an integer
		return invalid(i, "schema version %d is over %d", ev.SchemaVersion, math.MaxInt32)
	}
	if len(ev.Payload) > maxPayload {
		return invalid(i, "payload is %d bytes, over the %d-byte limit", len(ev.Payload), maxPayload)
	}
	isJSON := true
	if ev.ContentType != "" {
		var err error
		if isJSON, err = checkContentType(ev.ContentType); err != nil {
			return invalid(i, "%v", err)
		}
	}
	if isJSON {
		if len(ev.Payload) == 0 {
			return invalid(i, "payload is empty (use {} or null for no data)")
		}
		if err := checkJSON(ev.Payload); err != nil {
			return invalid(i, "payload: %v", err)
		}
	}
	if len(ev.Headers) > MaxHeaders {
		return invalid(i, "%d headers, over the limit of %d", len(ev.Headers), MaxHeaders)
	}
	for k, v := range ev.Headers {
		if err := checkHeader(k, v); err != nil {
			return invalid(i, "%v", err)
		}
	}
	return nil
}
