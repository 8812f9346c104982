package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Event is the intent to publish one event, recorded with Writer.InsertTx in
// the same transaction as the business change it describes.
type Event struct {
	// ID identifies the event everywhere: the outbox row, the broker message
	// (and the broker's dedup key), and the consumer's inbox. Leave it zero
	// and the writer assigns a UUIDv7.
	ID uuid.UUID
	// AggregateType names the kind of entity the event belongs to ("order").
	// Required.
	AggregateType string
	// AggregateID identifies the entity ("ord-42"). Events of one aggregate
	// are published and applied in the order they were written. Required.
	AggregateID string
	// Type is the event type ("OrderCreated"). Required.
	Type string
	// SchemaVersion is the version of the payload's schema. Defaults to 1.
	SchemaVersion int
	// Payload is the event body; it must be valid JSON. Required.
	Payload []byte
	// Headers are extra metadata carried to the broker, for example the W3C
	// trace context ("traceparent", "tracestate"). Optional.
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

// validate checks ev (the i-th of a call) against the writer's limits.
func (ev *Event) validate(i int, maxPayload int) error {
	switch {
	case ev.AggregateType == "":
		return invalid(i, "aggregate type is empty")
	case ev.AggregateID == "":
		return invalid(i, "aggregate id is empty")
	case ev.Type == "":
		return invalid(i, "event type is empty")
	case ev.SchemaVersion < 0:
		return invalid(i, "schema version %d is negative", ev.SchemaVersion)
	case len(ev.Payload) == 0:
		return invalid(i, "payload is empty (use {} or null for no data)")
	case len(ev.Payload) > maxPayload:
		return invalid(i, "payload is %d bytes, over the %d-byte limit", len(ev.Payload), maxPayload)
	case !json.Valid(ev.Payload):
		return invalid(i, "payload is not valid JSON")
	}
	for k := range ev.Headers {
		if k == "" {
			return invalid(i, "header with an empty name")
		}
	}
	return nil
}
