package outboxwebhook

import (
	"bufio"
	"bytes"
	"maps"
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox"
)

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

// header parses "key: value" lines into an http.Header, as a server would
// (canonical names, repeated names as several values).
func header(block string) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(block, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if ok {
			ck := textproto.CanonicalMIMEHeaderKey(k)
			h[ck] = append(h[ck], v)
		}
	}
	return h
}

const goodHeaders = "ce-specversion: 1.0\nce-id: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e\nce-type: OrderCreated\n" +
	"ce-source: urn:x\nce-subject: ord-1\nce-time: 2026-12-01T10:00:00.5Z\nce-aggregatetype: order\n" +
	"ce-sequence: 00000000000000000002\nce-schemaversion: 1\ncontent-type: application/json\n"

// TestDecodeRefuses: a missing, repeated or malformed attribute, or a user
// header list that does not match the headers, is an error.
func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	if _, err := Decode(header(goodHeaders), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]string{
		"missing id":        strings.Replace(goodHeaders, "ce-id:", "x-id:", 1),
		"repeated id":       goodHeaders + "ce-id: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6f\n",
		"bad sequence":      strings.Replace(goodHeaders, "00000000000000000002", "-2", 1),
		"bad version":       strings.Replace(goodHeaders, "ce-specversion: 1.0", "ce-specversion: 0.3", 1),
		"bad time":          strings.Replace(goodHeaders, "2026-12-01T10:00:00.5Z", "yesterday", 1),
		"skipped above":     goodHeaders + "ce-skippedfrom: 2\n",
		"bad replay":        goodHeaders + "ce-replayid: 00000000-0000-0000-0000-000000000000\n",
		"bad encoding":      strings.Replace(goodHeaders, "OrderCreated", "Order%2", 1),
		"listed no value":   goodHeaders + "ce-outboxheaders: traceparent\n",
		"value not listed":  goodHeaders + "ce-outboxheaders: a\na: 1\na: 2\n",
		"reserved listed":   goodHeaders + "ce-outboxheaders: webhook-id\nwebhook-id: x\n",
		"listed twice":      goodHeaders + "ce-outboxheaders: a,a\na: 1\na: 2\n",
		"empty aggregate t": strings.Replace(goodHeaders, "ce-aggregatetype: order", "ce-aggregatetype: ", 1),
	} {
		if m, err := Decode(header(block), nil); err == nil {
			t.Errorf("%s: decoded %+v", name, m)
		}
	}
	m, err := Decode(header(goodHeaders+"ce-outboxheaders: X-A,traceparent,x-a\nx-a: 1\ntraceparent: t\nX-a: 2\n"), nil)
	if err != nil || !maps.Equal(m.Headers, map[string]string{"X-A": "1", "x-a": "2", "traceparent": "t"}) {
		t.Fatalf("user headers: %v, %v", m.Headers, err)
	}
}

// FuzzDecode: Decode never panics on any set of headers a receiver can
// get, accepts only numbers in range, and whatever it accepts encodes back
// to the same message.
func FuzzDecode(f *testing.F) {
	f.Add(goodHeaders, []byte(`{}`))
	f.Add(goodHeaders+"ce-skippedfrom: 1\nce-outboxheaders: traceparent,Tp\ntraceparent: 00-x\ntp: y\n", []byte(`{}`))
	f.Add(strings.Replace(goodHeaders, "00000000000000000002", "-2", 1), []byte(`{}`))
	f.Add(strings.Replace(goodHeaders, "ord-1", "ord%20%C3%A9", 1), []byte(nil))
	f.Add(goodHeaders+"ce-skippedfrom: 2\n", []byte(nil))
	f.Add(goodHeaders+"ce-replayid: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6f\n", []byte(nil))
	f.Add(goodHeaders+"ce-outboxheaders: a,b\na: 1\n", []byte{0xff})
	f.Fuzz(func(t *testing.T, block string, body []byte) {
		m, err := Decode(header(block), body)
		if err != nil {
			return
		}
		if m.Sequence < 1 || m.SchemaVersion < 1 || m.SkippedFrom < 0 || (m.SkippedFrom > 0 && m.SkippedFrom >= m.Sequence) {
			t.Fatalf("accepted out-of-range numbers: %+v", m)
		}
		h := http.Header{}
		if err := encodeHeader(h, &m, "urn:x"); err != nil {
			if outbox.IsPermanent(err) {
				return // a header value HTTP cannot carry unchanged
			}
			t.Fatalf("encode a decoded message: %v", err)
		}
		// Through a real header block, as a server reads it.
		var buf bytes.Buffer
		if err := h.Write(&buf); err != nil {
			t.Fatal(err)
		}
		buf.WriteString("\r\n")
		read, err := textproto.NewReader(bufioReader(&buf)).ReadMIMEHeader()
		if err != nil {
			t.Fatalf("read back %q: %v", buf.String(), err)
		}
		again, err := Decode(http.Header(read), body)
		if err != nil {
			t.Fatalf("decode an encoded message: %v", err)
		}
		if !sameMessage(m, again) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, again)
		}
	})
}

func bufioReader(b *bytes.Buffer) *bufio.Reader { return bufio.NewReader(b) }

const goodStructured = `{"specversion":"1.0","id":"0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e","source":"urn:x","type":"OrderCreated",` +
	`"subject":"ord-1","time":"2026-12-01T10:00:00.5Z","datacontenttype":"application/json","aggregatetype":"order",` +
	`"sequence":"00000000000000000002","schemaversion":"1","partitionkey":"ord-1","data":{"a": [1, 2]}}`

// TestDecodeStructuredRefuses: a body that is not one JSON object of the
// attributes, or repeats a member, or carries its payload twice or
// malformed, is an error; "data" comes back byte for byte.
func TestDecodeStructuredRefuses(t *testing.T) {
	t.Parallel()
	m, err := decodeStructured([]byte(goodStructured))
	if err != nil || string(m.Payload) != `{"a": [1, 2]}` || m.Sequence != 2 {
		t.Fatalf("decode: %+v, %v", m, err)
	}
	for name, body := range map[string]string{
		"not JSON":         `{"specversion":`,
		"an array":         `[` + goodStructured + `]`,
		"trailing data":    goodStructured + `{}`,
		"repeated member":  strings.Replace(goodStructured, `"type":"OrderCreated"`, `"type":"OrderCreated","type":"OrderCancelled"`, 1),
		"number sequence":  strings.Replace(goodStructured, `"00000000000000000002"`, `2`, 1),
		"missing id":       strings.Replace(goodStructured, `"id":`, `"idx":`, 1),
		"data twice":       strings.Replace(goodStructured, `"data":`, `"data_base64":"AA==","data":`, 1),
		"bad base64":       strings.Replace(goodStructured, `"data":{"a": [1, 2]}`, `"data_base64":"%%"`, 1),
		"headers object":   strings.Replace(goodStructured, `"data":`, `"outboxheaders":{"a":"b"},"data":`, 1),
		"headers bad name": strings.Replace(goodStructured, `"data":`, `"outboxheaders":"{\"a b\":\"c\"}","data":`, 1),
		"not UTF-8":        strings.Replace(goodStructured, `ord-1`, "ord-\xff", 1),
		"text data object": strings.Replace(goodStructured, `"application/json"`, `"text/plain"`, 1),
	} {
		if m, err := decodeStructured([]byte(body)); err == nil {
			t.Errorf("%s: decoded %+v", name, m)
		}
	}
}

// FuzzDecodeStructured: decodeStructured never panics, accepts only
// numbers in range, and whatever it accepts encodes back to the same
// message.
func FuzzDecodeStructured(f *testing.F) {
	f.Add([]byte(goodStructured))
	f.Add([]byte(strings.Replace(goodStructured, `"data":{"a": [1, 2]}`, `"data_base64":"AAH/","skippedfrom":"1","replayid":"0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6f"`, 1)))
	f.Add([]byte(strings.Replace(goodStructured, `"data":`, `"outboxheaders":"{\"traceparent\":\"00-x\",\"Tp\":\" y \"}","data":`, 1)))
	f.Add([]byte(strings.Replace(goodStructured, `"application/json"`, `"text/plain"`, 1)))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := decodeStructured(body)
		if err != nil {
			return
		}
		if m.Sequence < 1 || m.SchemaVersion < 1 || m.SkippedFrom < 0 || (m.SkippedFrom > 0 && m.SkippedFrom >= m.Sequence) {
			t.Fatalf("accepted out-of-range numbers: %+v", m)
		}
		enc, err := encodeStructured(&m, "urn:x")
		if err != nil {
			t.Fatalf("encode a decoded message: %v", err)
		}
		again, err := decodeStructured(enc)
		if err != nil {
			t.Fatalf("decode an encoded message %s: %v", enc, err)
		}
		if len(again.Payload) == 0 && len(m.Payload) == 0 {
			again.Payload = m.Payload
		}
		if !sameMessage(m, again) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, again)
		}
	})
}
