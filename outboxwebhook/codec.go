package outboxwebhook

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/textproto"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cloudevents"
)

// Header names: the CloudEvents 1.0 attributes in the HTTP binding's binary
// content mode (ce- prefix), with the outbox extensions named as outboxnats
// and outboxkafka name them, and the Standard Webhooks headers. In
// structured mode the attributes have the same names without the prefix,
// as members of the JSON body.
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

	// HeaderSkippedFrom carries Message.SkippedFrom (decimal), only when it
	// is not zero.
	HeaderSkippedFrom = "ce-skippedfrom"
	// HeaderReplayID carries Message.ReplayID, only on replayed messages.
	HeaderReplayID = "ce-replayid"
	// HeaderHeaderNames lists the names of the message's own headers, as
	// they were spelled, separated by commas, only when there are any. HTTP
	// header names are case-insensitive (and Go canonicalizes them), so the
	// list is what lets Decode restore Message.Headers exactly.
	HeaderHeaderNames = "ce-outboxheaders"

	// HeaderWebhookID is the Standard Webhooks message id: the delivery id
	// (see [DeliveryID]).
	HeaderWebhookID = "webhook-id"
	// HeaderWebhookTimestamp is the Standard Webhooks timestamp, in Unix
	// seconds, of the attempt.
	HeaderWebhookTimestamp = "webhook-timestamp"
	// HeaderWebhookSignature holds one "v1,<base64 HMAC-SHA256>" per active
	// secret, separated by spaces.
	HeaderWebhookSignature = "webhook-signature"
	// HeaderIdempotencyKey is the delivery id too, for receivers whose
	// middleware deduplicates on it.
	HeaderIdempotencyKey = "idempotency-key"

	// SpecVersion is the CloudEvents version of the requests.
	SpecVersion = cloudevents.SpecVersion
	// ContentType is the content type of a payload whose message has none.
	ContentType = outbox.ContentTypeJSON
)

// binding names the attributes in Decode's errors ("header ce-id") and
// percent-decodes the string attributes.
var binding = cloudevents.Binding{Kind: "header", Prefix: "ce-", Unescape: cloudevents.DecodeValue}

// reserved reports whether a header name belongs to the adapter (ce-
// attributes, content-type, the Standard Webhooks headers and
// idempotency-key): a message's own headers never take them.
func reserved(key string) bool {
	k := strings.ToLower(key)
	return strings.HasPrefix(k, "ce-") || strings.HasPrefix(k, "webhook-") ||
		k == HeaderContentType || k == HeaderIdempotencyKey
}

// DeliveryID is the webhook-id (and Idempotency-Key) of a message: its event
// id, or for a replayed message (ReplayID set) "<event id>:<replay id>". A
// receiver that drops repeated webhook ids then drops retries of one
// delivery, but not a replay, which must get through as Nats-Msg-Id lets a
// replay through JetStream's deduplication (see outbox.Message.ReplayID).
// Inboxes deduplicate by the event id (ce-id), which a replay keeps.
func DeliveryID(msg *outbox.Message) string {
	if msg.ReplayID != uuid.Nil {
		return msg.ID.String() + ":" + msg.ReplayID.String()
	}
	return msg.ID.String()
}

// encodeHeader sets the CloudEvents attributes and the message's own headers
// of msg on h. It fails, as outbox.Permanent, for a message whose own
// headers cannot travel on an HTTP request unchanged.
func encodeHeader(h http.Header, msg *outbox.Message, source string) error {
	ct := msg.ContentType
	if ct == "" {
		ct = ContentType
	}
	if !validValue(ct) {
		return outbox.Permanent(fmt.Errorf("event %s: content type %q cannot be an HTTP header value", msg.ID, ct))
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == ContentTypeStructured {
		// A receiver would take it for structured mode, which a binary-mode
		// receiver refuses (ErrModeMismatch) whatever the event.
		return outbox.Permanent(fmt.Errorf("event %s: content type %s cannot travel in binary mode, where it says structured mode: use structured mode", msg.ID, ContentTypeStructured))
	}
	set := func(k, v string) { h[textproto.CanonicalMIMEHeaderKey(k)] = []string{v} }
	set(HeaderSpecVersion, SpecVersion)
	set(HeaderID, msg.ID.String())
	set(HeaderType, cloudevents.EncodeValue(msg.Type))
	set(HeaderSource, cloudevents.EncodeValue(source))
	set(HeaderSubject, cloudevents.EncodeValue(msg.AggregateID))
	set(HeaderTime, msg.OccurredAt.UTC().Format(time.RFC3339Nano))
	set(HeaderAggregateType, cloudevents.EncodeValue(msg.AggregateType))
	set(HeaderSequence, outbox.SequenceHeader(msg.Sequence))
	set(HeaderSchemaVersion, strconv.Itoa(msg.SchemaVersion))
	set(HeaderPartitionKey, cloudevents.EncodeValue(msg.AggregateID))
	set(HeaderContentType, ct)
	if msg.SkippedFrom > 0 {
		set(HeaderSkippedFrom, strconv.FormatInt(msg.SkippedFrom, 10))
	}
	if msg.ReplayID != uuid.Nil {
		set(HeaderReplayID, msg.ReplayID.String())
	}
	if len(msg.Headers) == 0 {
		return nil
	}
	names := make([]string, 0, len(msg.Headers))
	for k, v := range msg.Headers {
		switch {
		case !validName(k):
			return outbox.Permanent(fmt.Errorf("event %s: header name %q is not an HTTP token", msg.ID, k))
		case reserved(k):
			return outbox.Permanent(fmt.Errorf("event %s: header name %q is reserved by the webhook destination", msg.ID, k))
		case !validValue(v):
			return outbox.Permanent(fmt.Errorf("event %s: header %s: the value cannot travel as an HTTP header value unchanged (control character, or leading or trailing white space)", msg.ID, k))
		}
		names = append(names, k)
	}
	// Sorted, so that names differing only in case (one HTTP header with
	// several values) are listed in the order their values are added.
	sort.Strings(names)
	for _, k := range names {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		h[ck] = append(h[ck], msg.Headers[k])
	}
	set(HeaderHeaderNames, strings.Join(names, ","))
	return nil
}

// Decode turns a request's header and body back into the outbox.Message
// that was published, in either content mode (by the Content-Type:
// application/cloudevents+json is structured mode, anything else binary):
// ID, AggregateType, AggregateID, Sequence, Type, SchemaVersion,
// ContentType (ContentType when absent), SkippedFrom, ReplayID, Payload
// (byte for byte as published), Headers (as published; nil when there are
// none) and OccurredAt (UTC, to the nanosecond). Attempt is left zero.
//
// In binary mode the attributes are the ce- headers (names matched
// case-insensitively, as HTTP requires), the payload is body itself (not a
// copy), and the headers are those named in ce-outboxheaders. In structured
// mode everything comes from the body; ce- headers and the event headers'
// HTTP copies are ignored. When the request has a webhook-id header, it
// must be the DeliveryID of the decoded event, or Decode fails with an
// error wrapping ErrIDMismatch. It returns an error, never panics, when a
// required attribute is missing, repeated or malformed. Decode does not
// verify the signatures: [Verify] or a [Receiver] does.
func Decode(header http.Header, body []byte) (outbox.Message, error) {
	var m outbox.Message
	var err error
	if isStructured(header) {
		m, err = decodeStructured(body)
	} else {
		m, err = decodeBinary(header, body)
	}
	if err != nil {
		return outbox.Message{}, err
	}
	if ids := header.Values(HeaderWebhookID); len(ids) > 0 && (len(ids) > 1 || ids[0] != DeliveryID(&m)) {
		return outbox.Message{}, fmt.Errorf("outboxwebhook: webhook-id %q, event %s: %w", strings.Join(ids, ", "), DeliveryID(&m), ErrIDMismatch)
	}
	return m, nil
}

// decodeBinary decodes a binary-mode request: attributes in ce- headers,
// the payload as the body.
func decodeBinary(header http.Header, body []byte) (outbox.Message, error) {
	// one returns the value of a header that may appear once at most.
	one := func(key string) (string, bool, error) {
		switch vs := header.Values(key); len(vs) {
		case 0:
			return "", false, nil
		case 1:
			return vs[0], true, nil
		}
		return "", true, errors.New("appears more than once")
	}
	m, errs := cloudevents.DecodeAttributes(func(name string) (string, bool, error) {
		return one(binding.Prefix + name)
	}, binding)
	optional := func(key string) (string, bool) {
		v, ok, err := one(key)
		if err != nil {
			errs = append(errs, fmt.Errorf("header %s %w", key, err))
		}
		return v, ok && err == nil
	}
	m.ContentType = ContentType
	if v, ok := optional(HeaderContentType); ok {
		if v == "" || !validValue(v) {
			errs = append(errs, fmt.Errorf("header %s: %q is not a content type", HeaderContentType, v))
		}
		m.ContentType = v
	}
	if v, ok := optional(HeaderHeaderNames); ok {
		hs, err := decodeUserHeaders(header, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("header %s: %w", HeaderHeaderNames, err))
		}
		m.Headers = hs
	}
	if len(errs) > 0 {
		return outbox.Message{}, fmt.Errorf("outboxwebhook: not an outbox event: %w", errors.Join(errs...))
	}
	m.Payload = body
	return m, nil
}

// decodeUserHeaders collects the headers list names, in order: the i-th
// name of one canonical header takes that header's i-th value.
func decodeUserHeaders(header http.Header, list string) (map[string]string, error) {
	names := strings.Split(list, ",")
	hs := make(map[string]string, len(names))
	used := make(map[string]int, len(names))
	for _, k := range names {
		if !validName(k) || reserved(k) {
			return nil, fmt.Errorf("%q is not a header name a message may carry", k)
		}
		if _, dup := hs[k]; dup {
			return nil, fmt.Errorf("%q is listed twice", k)
		}
		ck := textproto.CanonicalMIMEHeaderKey(k)
		vs := header[ck]
		i := used[ck]
		if i >= len(vs) {
			return nil, fmt.Errorf("header %s is listed but has no value", k)
		}
		used[ck] = i + 1
		hs[k] = vs[i]
	}
	for ck, n := range used {
		if len(header[ck]) != n {
			return nil, fmt.Errorf("header %s has %d values for %d names", ck, len(header[ck]), n)
		}
	}
	return hs, nil
}

// validName reports whether k is an HTTP token (RFC 9110), the syntax the
// writer accepts for header names.
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether v travels as an HTTP header value unchanged:
// UTF-8 without control characters (tab included) and without leading or
// trailing spaces, which header parsing trims. The writer accepts only
// such values.
func validValue(v string) bool {
	if !utf8.ValidString(v) || strings.TrimSpace(v) != v {
		return false
	}
	for _, r := range v {
		if r < ' ' || r == 0x7F || (r >= 0x80 && r < 0xA0) {
			return false
		}
	}
	return true
}
