package outbox

import (
	"encoding/json"
	"fmt"
)

// messageRow is a Message as read from the columns of messageColumns, its
// headers still raw JSON. Decoding them is left to the caller, after the
// query: a row written by hand whose headers are valid JSON but not an
// object of strings then fails on its own, with a clear error, instead of
// failing the scan of a batch that has already been claimed.
type messageRow struct {
	Message
	headers string
}

// dest returns the scan destinations of messageColumns, followed by extra.
func (m *messageRow) dest(extra ...any) []any {
	return append([]any{&m.ID, &m.AggregateType, &m.AggregateID, &m.Sequence, &m.Type, &m.SchemaVersion,
		&m.ContentType, &m.Payload, &m.headers, &m.OccurredAt, &m.SkippedFrom}, extra...)
}

// decode completes the Message: headers decoded, occurred_at in UTC.
func (m *messageRow) decode() (Message, error) {
	msg := m.Message
	msg.OccurredAt = msg.OccurredAt.UTC()
	if m.headers != "" && m.headers != "{}" && m.headers != "null" {
		var h map[string]string
		if err := json.Unmarshal([]byte(m.headers), &h); err != nil {
			return msg, fmt.Errorf("undecodable row: headers are not a JSON object of strings: %v", err)
		}
		if len(h) > 0 {
			msg.Headers = h
		}
	}
	return msg, nil
}
