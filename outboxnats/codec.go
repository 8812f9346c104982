package outboxnats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cloudevents"
)

// Header names. The ce- headers carry the CloudEvents 1.0 attributes in
// binary content mode; HeaderMsgID is JetStream's deduplication key.
const (
	HeaderSpecVersion   = "ce-specversion"
	HeaderID            = "ce-id"
	HeaderType          = "ce-type"
	HeaderSource        = "ce-source"
	HeaderSubject       = "ce-subject"
	HeaderTime          = "ce-time"
	HeaderAggregateType = "ce-aggregatetype"
	HeaderSequence      = "ce-sequence"
	HeaderSchemaVersion = "ce-schemaversion"
	HeaderPartitionKey  = "ce-partitionkey"
	HeaderContentType   = "content-type"
	HeaderMsgID         = jetstream.MsgIDHeader // "Nats-Msg-Id"

	// HeaderSkippedFrom carries Message.SkippedFrom (decimal), only when it
	// is not zero.
	HeaderSkippedFrom = "ce-skippedfrom"
	// HeaderReplayID carries Message.ReplayID, only on replayed messages.
	HeaderReplayID = "ce-replayid"

	// SpecVersion is the CloudEvents version of the messages.
	SpecVersion = cloudevents.SpecVersion
	// ContentType is the content type of a payload whose message has none
	// (outbox.ContentTypeJSON). A message's own content type (the CloudEvents
	// datacontenttype, which the binary mode carries as content-type) is sent
	// as it is.
	ContentType = outbox.ContentTypeJSON
)

// MaxSubjectBytes is the longest subject the publisher sends. The server
// closes a connection whose control line ("HPUB <subject> <reply> <sizes>")
// passes its max_control_line (4,096 bytes by default), which fails every
// message in flight on it and, since the same event comes back first after a
// reconnect, would stop publishing for good. A longer subject is refused for
// its message alone, as outbox.Permanent. With the writer's limits
// (outbox.MaxAggregateIDBytes, outbox.MaxNameBytes) and a prefix of at most
// MaxSubjectPrefixBytes every subject fits, even percent-encoded.
const MaxSubjectBytes = 3840

// MaxSubjectPrefixBytes is the longest Config.SubjectPrefix accepted.
const MaxSubjectPrefixBytes = 256

// Subject returns the subject of an aggregate's events:
// "<prefix>.<type token>.<id token>". Each token is the string with every
// byte outside [A-Za-z0-9_-] written as %XX (upper-case hex), and the empty
// string written as "%". So any aggregate type or id (with '.', '*', '>',
// spaces, '%', unicode, ...) makes exactly one valid, wildcard-free token, and
// two different (type, id) pairs never share a subject.
func Subject(prefix, aggregateType, aggregateID string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(aggregateType) + len(aggregateID) + 8)
	b.WriteString(prefix)
	b.WriteByte('.')
	writeToken(&b, aggregateType)
	b.WriteByte('.')
	writeToken(&b, aggregateID)
	return b.String()
}

// AggregateTypeFilter returns the subject filter that matches every event of
// one aggregate type: "<prefix>.<type token>.>". Use it as a consumer's
// FilterSubject.
func AggregateTypeFilter(prefix, aggregateType string) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteByte('.')
	writeToken(&b, aggregateType)
	b.WriteString(".>")
	return b.String()
}

// ParseSubject is the inverse of Subject for a known prefix: it returns the
// aggregate type and id a subject was made from.
func ParseSubject(prefix, subject string) (aggregateType, aggregateID string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", "", fmt.Errorf("outboxnats: subject %q does not start with %q", subject, prefix+".")
	}
	typ, id, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(id, ".") {
		return "", "", fmt.Errorf("outboxnats: subject %q does not have two tokens after %q", subject, prefix)
	}
	if aggregateType, err = parseToken(typ); err != nil {
		return "", "", err
	}
	if aggregateID, err = parseToken(id); err != nil {
		return "", "", err
	}
	return aggregateType, aggregateID, nil
}

const hexDigits = "0123456789ABCDEF"

func tokenSafe(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

func writeToken(b *strings.Builder, s string) {
	if s == "" {
		b.WriteByte('%')
		return
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xF])
	}
}

func parseToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case tokenSafe(c):
			b.WriteByte(c)
		case c == '%' && i+2 < len(tok) && isUpperHex(tok[i+1]) && isUpperHex(tok[i+2]):
			d := unhex(tok[i+1])<<4 | unhex(tok[i+2])
			if tokenSafe(d) { // not how Subject writes it
				return "", fmt.Errorf("outboxnats: invalid subject token %q", tok)
			}
			b.WriteByte(d)
			i += 2
		default:
			return "", fmt.Errorf("outboxnats: invalid subject token %q", tok)
		}
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("outboxnats: invalid subject token %q", tok)
	}
	return b.String(), nil
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// binding names the attributes in Decode's errors ("header ce-id") and
// percent-decodes the string attributes.
var binding = cloudevents.Binding{Kind: "header", Prefix: "ce-", Unescape: cloudevents.DecodeValue}

// reserved reports whether a header name belongs to the adapter (ce-
// attributes, the content type) or to JetStream (Nats-*): a message's own
// headers never override them.
func reserved(key string) bool {
	k := strings.ToLower(key)
	return strings.HasPrefix(k, "ce-") || k == HeaderContentType || strings.HasPrefix(k, "nats-")
}

func validHeaderKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7F || c == ':' {
			return false
		}
	}
	return true
}

// natsMsg builds the NATS message of an outbox message, within the
// server's max payload.
func (p *Publisher) natsMsg(msg *outbox.Message) (*nats.Msg, error) {
	m, err := encode(msg, p.cfg.SubjectPrefix, p.cfg.Source)
	if err != nil {
		return nil, err
	}
	if max := p.nc.MaxPayload(); max > 0 {
		if size := int64(len(m.Data) + headerSize(m.Header)); size > max {
			return nil, outbox.Permanent(fmt.Errorf("event %s: message of %d bytes (payload and headers) exceeds the NATS server's max payload of %d bytes: %w",
				msg.ID, size, max, nats.ErrMaxPayload))
		}
	}
	return m, nil
}

// encode builds the NATS message of an outbox message: its subject, the
// CloudEvents attributes as ce- headers, the message's own headers and the
// payload as the data.
func encode(msg *outbox.Message, prefix, source string) (*nats.Msg, error) {
	id := msg.ID.String()
	h := make(nats.Header, 12+len(msg.Headers))
	for k, v := range msg.Headers {
		if reserved(k) {
			continue
		}
		if !validHeaderKey(k) {
			return nil, outbox.Permanent(fmt.Errorf("event %s: header name %q: %w", id, k, nats.ErrBadHeaderMsg))
		}
		h.Set(k, v)
	}
	h.Set(HeaderSpecVersion, SpecVersion)
	h.Set(HeaderID, id)
	h.Set(HeaderType, cloudevents.EncodeValue(msg.Type))
	h.Set(HeaderSource, cloudevents.EncodeValue(source))
	h.Set(HeaderSubject, cloudevents.EncodeValue(msg.AggregateID))
	h.Set(HeaderTime, msg.OccurredAt.UTC().Format(time.RFC3339Nano))
	h.Set(HeaderAggregateType, cloudevents.EncodeValue(msg.AggregateType))
	h.Set(HeaderSequence, outbox.SequenceHeader(msg.Sequence))
	h.Set(HeaderSchemaVersion, strconv.Itoa(msg.SchemaVersion))
	h.Set(HeaderPartitionKey, cloudevents.EncodeValue(msg.AggregateID))
	ct := msg.ContentType
	if ct == "" {
		ct = ContentType
	}
	h.Set(HeaderContentType, cloudevents.EncodeValue(ct))
	if msg.SkippedFrom > 0 {
		h.Set(HeaderSkippedFrom, strconv.FormatInt(msg.SkippedFrom, 10))
	}
	if msg.ReplayID != uuid.Nil {
		// A replay must reach the stream even within the duplicate window
		// of the original publish; a second run of the same replay is
		// still deduplicated.
		h.Set(HeaderReplayID, msg.ReplayID.String())
		h.Set(HeaderMsgID, id+":"+msg.ReplayID.String())
	} else {
		h.Set(HeaderMsgID, id)
	}

	m := &nats.Msg{
		Subject: Subject(prefix, msg.AggregateType, msg.AggregateID),
		Header:  h,
		Data:    msg.Payload,
	}
	if len(m.Subject) > MaxSubjectBytes {
		return nil, outbox.Permanent(fmt.Errorf("event %s: subject of %d bytes (aggregate type and id percent-encoded) exceeds %d bytes; the server would close the connection",
			id, len(m.Subject), MaxSubjectBytes))
	}
	return m, nil
}

// headerSize is the size of the encoded header block (as nats.go counts it).
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(strings.TrimSpace(v)) + 4
		}
	}
	return n
}

// Decode turns a message delivered from the stream (its headers and data)
// back into an outbox.Message: ID, AggregateType, AggregateID, Sequence,
// Type, SchemaVersion, ContentType (ContentType when the header is absent),
// SkippedFrom, ReplayID, Payload (data itself, not a copy), Headers (every
// header that is not a ce- attribute, content-type or a Nats- header, such
// as traceparent; nil when there is none) and OccurredAt (UTC). Attempt is
// left zero. It returns an error when a required ce- header is missing,
// repeated or malformed, by the rules every outbox codec shares (see
// outboxkafka.Decode). Header names are matched case-insensitively.
func Decode(header nats.Header, data []byte) (outbox.Message, error) {
	lower := lowerCase(header)
	m, errs := cloudevents.DecodeAttributes(func(name string) (string, bool, error) {
		return lookup(header, binding.Prefix+name, lower)
	}, binding)
	m.ContentType = ContentType
	if v, ok, err := lookup(header, HeaderContentType, lower); err != nil {
		errs = append(errs, fmt.Errorf("header %s %w", HeaderContentType, err))
	} else if ok {
		ct, err := cloudevents.DecodeValue(v)
		if err != nil || ct == "" {
			errs = append(errs, fmt.Errorf("header %s: %q is not a content type", HeaderContentType, v))
		}
		m.ContentType = ct
	}
	if len(errs) > 0 {
		return outbox.Message{}, fmt.Errorf("outboxnats: not an outbox event: %w", errors.Join(errs...))
	}
	for k, vs := range header {
		if reserved(k) || len(vs) == 0 {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[k] = vs[0]
	}
	m.Payload = data
	return m, nil
}

// lookup returns the value of a header that may appear once at most, its
// name (lower-case) matched case-insensitively. lower (see lowerCase)
// says that the attribute names in h are lower-case, as encode writes them:
// then key has one spelling and is looked up directly rather than compared
// with every name.
func lookup(h nats.Header, key string, lower bool) (string, bool, error) {
	var v string
	n := 0
	if lower {
		if vs := h[key]; len(vs) > 0 {
			v, n = vs[0], len(vs)
		}
	} else {
		for k, vs := range h {
			if len(vs) > 0 && strings.EqualFold(k, key) {
				v = vs[0]
				n += len(vs)
			}
		}
	}
	switch n {
	case 0:
		return "", false, nil
	case 1:
		return v, true, nil
	}
	return "", true, errors.New("appears more than once")
}

// lowerCase reports whether the names of the ce- headers and content-type
// in h are lower-case (other names, such as Nats-Msg-Id, do not matter).
func lowerCase(h nats.Header) bool {
	for k := range h {
		if !(len(k) >= 3 && strings.EqualFold(k[:3], "ce-")) && !strings.EqualFold(k, HeaderContentType) {
			continue
		}
		for i := 0; i < len(k); i++ {
			if 'A' <= k[i] && k[i] <= 'Z' {
				return false
			}
		}
	}
	return true
}
