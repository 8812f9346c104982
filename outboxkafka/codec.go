package outboxkafka

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cloudevents"
)

// Header names: the CloudEvents 1.0 attributes in the Kafka binding's binary
// content mode (ce_ prefix), with the outbox extensions named as outboxnats
// names them.
const (
	HeaderSpecVersion   = "ce_specversion"
	HeaderID            = "ce_id"
	HeaderType          = "ce_type"
	HeaderSource        = "ce_source"
	HeaderSubject       = "ce_subject"
	HeaderTime          = "ce_time"
	HeaderAggregateType = "ce_aggregatetype"
	HeaderSequence      = "ce_sequence"
	HeaderSchemaVersion = "ce_schemaversion"
	HeaderContentType   = "content-type"

	// HeaderSkippedFrom carries Message.SkippedFrom (decimal), only when it
	// is not zero.
	HeaderSkippedFrom = "ce_skippedfrom"
	// HeaderReplayID carries Message.ReplayID, only on replayed messages.
	HeaderReplayID = "ce_replayid"

	// SpecVersion is the CloudEvents version of the records.
	SpecVersion = cloudevents.SpecVersion
	// ContentType is the content type of a payload whose message has none.
	ContentType = outbox.ContentTypeJSON
)

// binding names the attributes in Decode's errors: "header ce_id".
var binding = cloudevents.Binding{Kind: "header", Prefix: "ce_"}

// reserved reports whether a header name belongs to the adapter (ce_
// attributes, the content type): a message's own headers never override
// them.
func reserved(key string) bool {
	k := strings.ToLower(key)
	return strings.HasPrefix(k, "ce_") || k == HeaderContentType
}

// encode builds the Kafka record of an outbox message: topic, key (the
// aggregate id), the CloudEvents attributes as ce_ headers, the message's own
// headers and the payload as the value. Header values are the attribute
// strings as UTF-8, unencoded, as the Kafka binding specifies.
func encode(msg *outbox.Message, topicTemplate, source string) (*kgo.Record, error) {
	id := msg.ID.String()
	topic, err := Topic(topicTemplate, msg.AggregateType)
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("outboxkafka: event %s: %w", id, err))
	}
	ct := msg.ContentType
	if ct == "" {
		ct = ContentType
	}
	h := make([]kgo.RecordHeader, 0, 12+len(msg.Headers))
	add := func(k, v string) { h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderSpecVersion, SpecVersion)
	add(HeaderID, id)
	add(HeaderType, msg.Type)
	add(HeaderSource, source)
	add(HeaderSubject, msg.AggregateID)
	add(HeaderTime, msg.OccurredAt.UTC().Format(time.RFC3339Nano))
	add(HeaderAggregateType, msg.AggregateType)
	add(HeaderSequence, outbox.SequenceHeader(msg.Sequence))
	add(HeaderSchemaVersion, strconv.Itoa(msg.SchemaVersion))
	add(HeaderContentType, ct)
	if msg.SkippedFrom > 0 {
		add(HeaderSkippedFrom, strconv.FormatInt(msg.SkippedFrom, 10))
	}
	if msg.ReplayID != uuid.Nil {
		add(HeaderReplayID, msg.ReplayID.String())
	}
	for k, v := range msg.Headers {
		if !reserved(k) {
			add(k, v)
		}
	}
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(msg.AggregateID), // never nil: the key partitioner hashes it
		Value:   msg.Payload,
		Headers: h,
	}, nil
}

// recordSize is an upper bound of the record's size in a produce request:
// key, value, headers and the per-record varint overhead.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 32
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// Decode turns a record read from a topic back into the outbox.Message that
// was published: ID, AggregateType, AggregateID, Sequence, Type,
// SchemaVersion, ContentType (ContentType when the header is absent),
// SkippedFrom, ReplayID, Payload (the record's value itself, not a copy),
// Headers (every header that is not a ce_ attribute or content-type; nil
// when there is none) and OccurredAt (UTC, to the nanosecond). Attempt is
// left zero. It returns an error, never panics, when a required ce_ header
// is missing, repeated or malformed. Header names are matched exactly (the
// binding's lower-case names).
func Decode(record *kgo.Record) (outbox.Message, error) {
	if record == nil {
		return outbox.Message{}, errors.New("outboxkafka: nil record")
	}
	var errs []error
	attrs := make(map[string]string, 12)
	for _, rh := range record.Headers {
		if !reserved(rh.Key) {
			continue
		}
		if _, dup := attrs[rh.Key]; dup {
			errs = append(errs, fmt.Errorf("header %s appears more than once", rh.Key))
			continue
		}
		if !utf8.Valid(rh.Value) {
			errs = append(errs, fmt.Errorf("header %s is not UTF-8", rh.Key))
		}
		attrs[rh.Key] = string(rh.Value)
	}
	m, aerrs := cloudevents.DecodeAttributes(func(name string) (string, bool, error) {
		v, ok := attrs[binding.Prefix+name]
		return v, ok, nil
	}, binding)
	errs = append(errs, aerrs...)
	m.ContentType = ContentType
	if v, ok := attrs[HeaderContentType]; ok {
		if v == "" {
			errs = append(errs, fmt.Errorf("header %s is empty", HeaderContentType))
		}
		m.ContentType = v
	}
	if len(errs) > 0 {
		return outbox.Message{}, fmt.Errorf("outboxkafka: not an outbox event: %w", errors.Join(errs...))
	}
	for _, rh := range record.Headers {
		if reserved(rh.Key) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		if _, seen := m.Headers[rh.Key]; !seen { // the first of repeated headers
			m.Headers[rh.Key] = string(rh.Value)
		}
	}
	m.Payload = record.Value
	return m, nil
}
