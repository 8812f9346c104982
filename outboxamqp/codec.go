package outboxamqp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cloudevents"
)

// Application property names: the CloudEvents 1.0 attributes in the AMQP
// binding's binary content mode ("cloudEvents:" prefix), with the outbox
// extensions named as outboxnats and outboxkafka name them. The content type
// is the message's content-type property, not an application property.
const (
	PropSpecVersion   = "cloudEvents:specversion"
	PropID            = "cloudEvents:id"
	PropType          = "cloudEvents:type"
	PropSource        = "cloudEvents:source"
	PropSubject       = "cloudEvents:subject"
	PropTime          = "cloudEvents:time"
	PropAggregateType = "cloudEvents:aggregatetype"
	PropSequence      = "cloudEvents:sequence"
	PropSchemaVersion = "cloudEvents:schemaversion"

	// PropSkippedFrom carries Message.SkippedFrom (decimal), only when it
	// is not zero.
	PropSkippedFrom = "cloudEvents:skippedfrom"
	// PropReplayID carries Message.ReplayID, only on replayed messages.
	PropReplayID = "cloudEvents:replayid"

	// SpecVersion is the CloudEvents version of the messages.
	SpecVersion = cloudevents.SpecVersion
	// ContentType is the content type of a payload whose message has none.
	ContentType = outbox.ContentTypeJSON
)

// maxShortString is the longest AMQP short string: routing keys, exchange
// names and application property names.
const maxShortString = 255

// reserved reports whether an application property name belongs to the
// adapter or to the broker's routing: the CloudEvents attributes (either
// prefix the binding allows, any case), and "CC" and "BCC", which RabbitMQ
// reads as extra routing keys (sender-selected distribution). A message's
// own headers never set them.
func reserved(key string) bool {
	k := strings.ToLower(key)
	return strings.HasPrefix(k, "cloudevents:") || strings.HasPrefix(k, "cloudevents_") || key == "CC" || key == "BCC"
}

// binding names the attributes in Decode's errors: "property
// cloudEvents:id".
var binding = cloudevents.Binding{Kind: "property", Prefix: "cloudEvents:"}

// attribute holds the names of the properties Decode reads.
var attribute = map[string]bool{
	PropSpecVersion: true, PropID: true, PropType: true, PropSource: true, PropSubject: true, PropTime: true,
	PropAggregateType: true, PropSequence: true, PropSchemaVersion: true, PropSkippedFrom: true, PropReplayID: true,
}

// encode builds the AMQP message of an outbox message and its routing key:
// persistent, message-id the event id, the CloudEvents attributes as
// cloudEvents: application properties, the message's own headers as plain
// application properties and the payload as the body.
func encode(msg *outbox.Message, routingKey, source string) (amqp.Publishing, string, error) {
	id := msg.ID.String()
	key, err := RoutingKey(routingKey, msg.AggregateType, msg.AggregateID)
	if err != nil {
		return amqp.Publishing{}, "", outbox.Permanent(fmt.Errorf("outboxamqp: event %s: %w", id, err))
	}
	ct := msg.ContentType
	if ct == "" {
		ct = ContentType
	}
	h := make(amqp.Table, 12+len(msg.Headers))
	for k, v := range msg.Headers {
		if reserved(k) {
			continue
		}
		if len(k) > maxShortString || k == "" {
			return amqp.Publishing{}, "", outbox.Permanent(fmt.Errorf("outboxamqp: event %s: header name of %d bytes: AMQP allows 1 to %d", id, len(k), maxShortString))
		}
		h[k] = v
	}
	h[PropSpecVersion] = SpecVersion
	h[PropID] = id
	h[PropType] = msg.Type
	h[PropSource] = source
	h[PropSubject] = msg.AggregateID
	h[PropTime] = msg.OccurredAt.UTC().Format(time.RFC3339Nano)
	h[PropAggregateType] = msg.AggregateType
	h[PropSequence] = outbox.SequenceHeader(msg.Sequence)
	h[PropSchemaVersion] = strconv.Itoa(msg.SchemaVersion)
	if msg.SkippedFrom > 0 {
		h[PropSkippedFrom] = strconv.FormatInt(msg.SkippedFrom, 10)
	}
	if msg.ReplayID != uuid.Nil {
		h[PropReplayID] = msg.ReplayID.String()
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  ct,
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    msg.OccurredAt.UTC(),
		Type:         msg.Type,
		Body:         msg.Payload,
	}, key, nil
}

// size is an upper bound of the message's size on the wire: body,
// properties and the frame overhead.
func size(p *amqp.Publishing, key string) int {
	n := len(p.Body) + len(key) + len(p.ContentType) + len(p.MessageId) + len(p.Type) + 128
	for k, v := range p.Headers {
		n += len(k) + 6
		if s, ok := v.(string); ok {
			n += len(s)
		}
	}
	return n
}

// Decode turns a delivery read from a queue back into the outbox.Message that
// was published: ID, AggregateType, AggregateID, Sequence, Type,
// SchemaVersion, ContentType (the content-type property; ContentType when it
// is empty), SkippedFrom, ReplayID, Payload (the delivery's body itself, not
// a copy), Headers (every application property with a string value that is
// not a CloudEvents attribute; nil when there is none) and OccurredAt (UTC,
// to the nanosecond). Attempt is left zero. Properties whose value is not a
// string, such as the x-death table RabbitMQ adds when it dead-letters a
// message, are not part of the Message. It returns an error, never panics,
// when a required cloudEvents: property is missing, not a string or
// malformed. Property names are matched exactly (the binding's
// "cloudEvents:" spelling).
func Decode(d amqp.Delivery) (outbox.Message, error) {
	var errs []error
	attrs := make(map[string]string, 12)
	unreadable := make(map[string]error)
	for k, v := range d.Headers {
		if !attribute[k] {
			continue // other cloudEvents: names are not the outbox's: ignored
		}
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		default:
			unreadable[k] = fmt.Errorf("is a %T, not a string", v)
			continue
		}
		if !utf8.ValidString(s) {
			errs = append(errs, fmt.Errorf("property %s is not UTF-8", k))
		}
		attrs[k] = s
	}
	m, aerrs := cloudevents.DecodeAttributes(func(name string) (string, bool, error) {
		if err := unreadable[binding.Prefix+name]; err != nil {
			return "", true, err
		}
		v, ok := attrs[binding.Prefix+name]
		return v, ok, nil
	}, binding)
	errs = append(errs, aerrs...)
	m.ContentType = ContentType
	if d.ContentType != "" {
		m.ContentType = d.ContentType
	}
	if len(errs) > 0 {
		return outbox.Message{}, fmt.Errorf("outboxamqp: not an outbox event: %w", errors.Join(errs...))
	}
	for k, v := range d.Headers {
		if reserved(k) {
			continue
		}
		s, ok := v.(string)
		if !ok || k == "" || len(k) > maxShortString {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[k] = s
	}
	m.Payload = d.Body
	return m, nil
}
