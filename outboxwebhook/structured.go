package outboxwebhook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cloudevents"
)

// Mode is how a request carries an event: the content modes of the
// CloudEvents HTTP binding.
type Mode string

const (
	// Structured sends the event as one JSON object (CloudEvents JSON
	// format, Content-Type application/cloudevents+json): every attribute
	// and the payload are in the body, so the Standard Webhooks signature
	// of the body covers all of them. The default.
	Structured Mode = "structured"
	// Binary sends the payload as the body and the attributes as ce-
	// headers, which webhook-outbox-signature signs (see the package
	// documentation). For endpoints that want the payload as the body.
	Binary Mode = "binary"
)

// ContentTypeStructured is the media type of a structured-mode request.
const ContentTypeStructured = "application/cloudevents+json"

// contentTypeStructuredSent is the Content-Type header a structured-mode
// request carries.
const contentTypeStructuredSent = ContentTypeStructured + "; charset=utf-8"

// HeaderOutboxSignature holds the signatures of a binary-mode request's
// attributes: one "v1,<base64 HMAC-SHA256>" per active secret, separated by
// spaces, over "<webhook-id>.<webhook-timestamp>.<canonical headers>\n<body>"
// (see the package documentation).
const HeaderOutboxSignature = "webhook-outbox-signature"

// extHeaders is the structured-mode extension attribute that carries the
// event's own headers: a JSON object of name to value, as a JSON string
// (CloudEvents attribute values are strings, not objects).
const extHeaders = "outboxheaders"

// parseMode reads a Mode; "" is Structured.
func parseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return Structured, nil
	case Structured, Binary:
		return m, nil
	}
	return "", fmt.Errorf("%q is not a content mode: want structured or binary", s)
}

// isStructured reports whether a request's Content-Type is the
// CloudEvents JSON format (structured mode).
func isStructured(header http.Header) bool {
	mt, _, err := mime.ParseMediaType(header.Get(HeaderContentType))
	return err == nil && mt == ContentTypeStructured
}

// isJSONType reports whether a content type is JSON (application/json or
// a +json suffix), whose payload may go in "data" as it is.
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// jsonString appends s as a JSON string (no HTML escaping).
func jsonString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Truncate(b.Len() - 1)
}

// encodeStructured returns msg as a CloudEvents JSON object. The payload
// goes in "data" byte for byte when the content type is JSON and the
// payload is one JSON value, in UTF-8, without white space around it
// (what a decoder returns as it was); otherwise in "data_base64". No
// payload, neither. It fails, as outbox.Permanent, for text that JSON
// cannot carry exactly (not UTF-8).
func encodeStructured(msg *outbox.Message, source string) ([]byte, error) {
	ct := msg.ContentType
	if ct == "" {
		ct = ContentType
	}
	for name, v := range map[string]string{"type": msg.Type, "aggregate type": msg.AggregateType, "aggregate id": msg.AggregateID, "content type": ct, "source": source} {
		if !utf8.ValidString(v) {
			return nil, outbox.Permanent(fmt.Errorf("event %s: the %s is not UTF-8", msg.ID, name))
		}
	}
	var b bytes.Buffer
	b.Grow(len(msg.Payload)*4/3 + 512)
	b.WriteByte('{')
	field := func(k, v string) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		jsonString(&b, k)
		b.WriteByte(':')
		jsonString(&b, v)
	}
	field("specversion", SpecVersion)
	field("id", msg.ID.String())
	field("source", source)
	field("type", msg.Type)
	field("subject", msg.AggregateID)
	field("time", msg.OccurredAt.UTC().Format(time.RFC3339Nano))
	field("datacontenttype", ct)
	field("aggregatetype", msg.AggregateType)
	field("sequence", outbox.SequenceHeader(msg.Sequence))
	field("schemaversion", strconv.Itoa(msg.SchemaVersion))
	field("partitionkey", msg.AggregateID)
	if msg.SkippedFrom > 0 {
		field("skippedfrom", strconv.FormatInt(msg.SkippedFrom, 10))
	}
	if msg.ReplayID != uuid.Nil {
		field("replayid", msg.ReplayID.String())
	}
	if len(msg.Headers) > 0 {
		for k, v := range msg.Headers {
			if !validName(k) || !utf8.ValidString(v) {
				return nil, outbox.Permanent(fmt.Errorf("event %s: header %q: the name is not an HTTP token or the value is not UTF-8", msg.ID, k))
			}
		}
		hs, err := json.Marshal(msg.Headers) // keys sorted
		if err != nil {
			return nil, outbox.Permanent(fmt.Errorf("event %s: headers: %w", msg.ID, err))
		}
		field(extHeaders, string(hs))
	}
	switch p := msg.Payload; {
	case len(p) == 0:
	case isJSONType(ct) && utf8.Valid(p) && json.Valid(p) && len(bytes.TrimSpace(p)) == len(p):
		b.WriteString(`,"data":`)
		b.Write(p)
	default:
		b.WriteString(`,"data_base64":"`)
		b.WriteString(base64.StdEncoding.EncodeToString(p))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeStructured reads a CloudEvents JSON object into the message it
// carries, with the rules of every binding (cloudevents.DecodeAttributes).
// The body must be UTF-8 and one JSON object without repeated members;
// "data" is the payload byte for byte, "data_base64" is decoded, and a
// payload in neither is empty.
func decodeStructured(body []byte) (outbox.Message, error) {
	fail := func(err error) (outbox.Message, error) {
		return outbox.Message{}, fmt.Errorf("outboxwebhook: not an outbox event: %w", err)
	}
	if !utf8.Valid(body) {
		return fail(errors.New("the body is not UTF-8"))
	}
	fields, err := jsonMembers(body)
	if err != nil {
		return fail(err)
	}
	str := func(name string) (string, bool, error) {
		raw, ok := fields[name]
		if !ok {
			return "", false, nil
		}
		var s string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return "", true, errors.New("is not a JSON string")
		}
		return s, true, nil
	}
	m, errs := cloudevents.DecodeAttributes(str, cloudevents.Binding{Kind: "attribute", Prefix: ""})
	m.ContentType = ContentType
	if v, ok, err := str("datacontenttype"); err != nil {
		errs = append(errs, fmt.Errorf("attribute datacontenttype %w", err))
	} else if ok {
		if v == "" {
			errs = append(errs, errors.New("attribute datacontenttype is empty"))
		}
		m.ContentType = v
	}
	if v, ok, err := str(extHeaders); err != nil {
		errs = append(errs, fmt.Errorf("attribute %s %w", extHeaders, err))
	} else if ok {
		if err := json.Unmarshal([]byte(v), &m.Headers); err != nil || m.Headers == nil {
			errs = append(errs, fmt.Errorf("attribute %s: not a JSON object of strings", extHeaders))
		}
		for k := range m.Headers {
			if !validName(k) {
				errs = append(errs, fmt.Errorf("attribute %s: %q is not a header name", extHeaders, k))
			}
		}
	}
	data, hasData := fields["data"]
	data64, hasData64 := fields["data_base64"]
	switch {
	case hasData && hasData64:
		errs = append(errs, errors.New("both data and data_base64"))
	case hasData64:
		var s string
		if len(data64) == 0 || data64[0] != '"' || json.Unmarshal(data64, &s) != nil {
			errs = append(errs, errors.New("data_base64 is not a JSON string"))
		} else if m.Payload, err = base64.StdEncoding.DecodeString(s); err != nil {
			errs = append(errs, errors.New("data_base64 is not standard base64"))
		}
	case hasData && isJSONType(m.ContentType):
		m.Payload = data
	case hasData:
		// Another content type: CloudEvents allows its text as a JSON
		// string.
		var s string
		if len(data) == 0 || data[0] != '"' || json.Unmarshal(data, &s) != nil {
			errs = append(errs, fmt.Errorf("data of content type %q is not a JSON string (binary data goes in data_base64)", m.ContentType))
		}
		m.Payload = []byte(s)
	}
	if len(errs) > 0 {
		return fail(errors.Join(errs...))
	}
	return m, nil
}

// jsonMembers splits a JSON object into its members, each value's bytes
// as they are in body. A repeated member, trailing data, or anything but
// an object is an error.
func jsonMembers(body []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("the body is not a JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("malformed JSON: %w", err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("malformed JSON: %w", err)
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("member %q appears more than once", key)
		}
		fields[key] = raw
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errors.New("malformed JSON: the object does not end")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return fields, nil
}

// headerCopies sets the event's own headers on h, for the request's HTTP
// middleware (tracing reads traceparent): those a request can carry
// unchanged and whose names the adapter does not use. They are copies:
// the signed body is what the Receiver reads.
func headerCopies(h http.Header, msg *outbox.Message) {
	names := make([]string, 0, len(msg.Headers))
	for k, v := range msg.Headers {
		if validName(k) && !reserved(k) && validValue(v) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		h.Add(k, msg.Headers[k])
	}
}
