package outboxwebhook_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// The test vectors of docs/destinations.md ("Verifying in another
// language"): one event, signed with the Standard Webhooks specification's
// test secret at vectorTime, in each mode.
const (
	vectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorTime   = 1767323045 // 2026-01-02T03:04:05Z
	// Structured mode: the body, and webhook-signature over
	// "<webhook-id>.<webhook-timestamp>.<body>".
	vectorStructuredBody = `{"specversion":"1.0","id":"0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","source":"/shop","type":"OrderCreated","subject":"o-42","time":"2026-01-02T03:04:05Z","datacontenttype":"application/json","aggregatetype":"order","sequence":"00000000000000000001","schemaversion":"1","partitionkey":"o-42","outboxheaders":"{\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}","data":{"total":1299}}`
	vectorStructuredSig  = "v1,/O9AELeCfzXzzKeHniFPlPfNYifiGy3Ah0z1BDnAUKw="
	// Binary mode: the canonical headers webhook-outbox-signature signs,
	// and the two signatures.
	vectorBinaryCanonical = "ce-aggregatetype:order\nce-id:0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b\nce-outboxheaders:traceparent\n" +
		"ce-partitionkey:o-42\nce-schemaversion:1\nce-sequence:00000000000000000001\nce-source:/shop\nce-specversion:1.0\n" +
		"ce-subject:o-42\nce-time:2026-01-02T03:04:05Z\nce-type:OrderCreated\ncontent-type:application/json\n" +
		"traceparent:00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n"
	vectorBinarySig     = "v1,a0bA2MEKIFySoQAOnfgxOVDchXOLOwOTbjo1kWRTbZc="
	vectorBinaryAttrSig = "v1,MsLVMg3FS0oG/C+hIMVe6JvNhthRoJw1fgST3skjlf8="
)

func vectorMessage() outbox.Message {
	return outbox.Message{
		ID: uuid.MustParse("0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"), AggregateType: "order", AggregateID: "o-42", Sequence: 1,
		Type: "OrderCreated", SchemaVersion: 1, Payload: []byte(`{"total":1299}`),
		Headers:    map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

// capture publishes m in mode at the vector's time and returns the request.
func capture(t *testing.T, mode outboxwebhook.Mode, m outbox.Message) captured {
	t.Helper()
	var c captured
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c = captured{header: r.Header.Clone(), body: body}
	}))
	defer srv.Close()
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{vectorSecret}, Source: "/shop", Mode: mode})
	outboxwebhook.SetClock(p, func() time.Time { return time.Unix(vectorTime, 0) })
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSignatureVectorsInDocs: the publisher produces the documented test
// vectors (checked by hand with Python's hmac), and Verify and Decode accept
// them.
func TestSignatureVectorsInDocs(t *testing.T) {
	t.Parallel()
	at := time.Unix(vectorTime, 0)
	s := capture(t, outboxwebhook.Structured, vectorMessage())
	if string(s.body) != vectorStructuredBody || s.header.Get("webhook-signature") != vectorStructuredSig ||
		s.header.Get("webhook-id") != vectorMessage().ID.String() || s.header.Get("webhook-timestamp") != "1767323045" {
		t.Errorf("structured mode: body\n%s\nwebhook-signature %s; want the documented vector", s.body, s.header.Get("webhook-signature"))
	}
	b := capture(t, outboxwebhook.Binary, vectorMessage())
	if string(b.body) != `{"total":1299}` || b.header.Get("webhook-signature") != vectorBinarySig || b.header.Get("webhook-outbox-signature") != vectorBinaryAttrSig {
		t.Errorf("binary mode: webhook-signature %s, webhook-outbox-signature %s; want the documented vector", b.header.Get("webhook-signature"), b.header.Get("webhook-outbox-signature"))
	}
	// The canonical headers, as documented, are what the signature covers.
	var lines []string
	for k, vs := range b.header {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "ce-") || lk == "content-type" || lk == "traceparent" {
			lines = append(lines, lk+":"+vs[0]+"\n")
		}
	}
	slices.Sort(lines)
	if got := strings.Join(lines, ""); got != vectorBinaryCanonical {
		t.Errorf("canonical headers:\n%s\nwant\n%s", got, vectorBinaryCanonical)
	}
	for name, c := range map[string]captured{"structured": s, "binary": b} {
		if err := outboxwebhook.Verify([]string{vectorSecret}, outboxwebhook.Mode(name), c.header, c.body, 0, at); err != nil {
			t.Errorf("%s: Verify: %v", name, err)
		}
		m, err := outboxwebhook.Decode(c.header, c.body)
		if want := vectorMessage(); err != nil || !sameMessage(m, withContentType(want)) {
			t.Errorf("%s: Decode: %+v, %v", name, m, err)
		}
	}
}

func withContentType(m outbox.Message) outbox.Message {
	m.ContentType = outbox.ContentTypeJSON
	return m
}
