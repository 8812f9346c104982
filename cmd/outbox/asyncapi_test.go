package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/secrettest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// asyncAPIValidator is the npm @asyncapi/parser check (.ci/setup runs npm ci
// in its directory).
const asyncAPIValidator = "testdata/asyncapi"

// TestAsyncAPIValidates: every document `outbox asyncapi` prints (all the
// bindings, and each destination with options) is valid AsyncAPI 3 for the
// AsyncAPI initiative's own parser, and names no credential of the URL.
func TestAsyncAPIValidates(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(asyncAPIValidator, "node_modules", "@asyncapi", "parser")); err != nil {
		t.Fatalf("@asyncapi/parser is not installed (%v): run .ci/setup, or npm ci in cmd/outbox/%s", err, asyncAPIValidator)
	}
	for _, tc := range []struct{ dest, channel string }{
		{"", "amqp,kafka,nats,webhook"},
		{"nats://relay:s3cret@127.0.0.1:4222?stream=SHOP&subject_prefix=shop.events&source=/shop", "nats"},
		{"kafka://relay:s3cret@b1:9092,b2:9092?topic=shop.{aggregate_type}&sasl=scram-sha-512", "kafka"},
		{"amqps://relay:s3cret@mq.example:5671/shop?exchange=shop&routing_key=ev.{aggregate_type}", "amqp"},
		{"https://hooks.example/in/s3cret?outbox_mode=binary", "webhook"},
		{"http://hooks.example/in/s3cret", "webhook"},
	} {
		doc, err := asyncAPIDocument(tc.dest, "shop events", "2.1.0")
		if err != nil {
			t.Fatalf("%q: %v", tc.dest, err)
		}
		text, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(text), "s3cret") {
			t.Errorf("%q: the document prints a secret of the URL:\n%s", tc.dest, text)
		}
		file := filepath.Join(t.TempDir(), "asyncapi.json")
		if err := os.WriteFile(file, text, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("node", "validate.mjs", file)
		cmd.Dir = asyncAPIValidator
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%q: @asyncapi/parser refused the document (%v):\n%s", tc.dest, err, out)
			continue
		}
		last := strings.TrimSpace(string(out))
		last = last[strings.LastIndex(last, "\n")+1:]
		var v struct {
			Valid    bool     `json:"valid"`
			Channels []string `json:"channels"`
		}
		if err := json.Unmarshal([]byte(last), &v); err != nil || !v.Valid || strings.Join(v.Channels, ",") != tc.channel {
			t.Errorf("%q: the parser read %+v (%v), want channels %s:\n%s", tc.dest, v, err, tc.channel, out)
		}
	}
}

// TestAsyncAPINamesEveryHeaderNATSSends publishes an event with every
// optional attribute set through the real publisher and checks that each
// header the message carries is in the document's NATS message: the
// document is drawn from the code, not kept beside it.
func TestAsyncAPINamesEveryHeaderNATSSends(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := outboxtest.UniqueName(t, "ASYNCAPI")
	pub, err := outboxnats.NewPublisher(ctx, js, outboxnats.Config{Stream: stream, SubjectPrefix: stream})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	msg := outbox.Message{ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: "o-1", Sequence: 3, SkippedFrom: 2,
		Type: "OrderPlaced", SchemaVersion: 1, Payload: []byte(`{}`), OccurredAt: time.Now(), ReplayID: uuid.New(),
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	if errs := pub.Publish(ctx, []outbox.Message{msg}); len(errs) > 0 && errs[0] != nil {
		t.Fatal(errs[0])
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := asyncAPIDocument("", "t", "1")
	if err != nil {
		t.Fatal(err)
	}
	props := doc["components"].(obj)["messages"].(obj)["natsEvent"].(obj)["headers"].(obj)["properties"].(obj)
	named := map[string]bool{"content-type": true} // the message's contentType
	for k := range props {
		named[strings.ToLower(k)] = true
	}
	for name := range raw.Header {
		if !named[strings.ToLower(name)] {
			t.Errorf("the NATS message carries header %q, which the AsyncAPI document does not name", name)
		}
	}
	if len(raw.Header) < 12 {
		t.Errorf("only %d headers on the message (%v): the test publishes every optional attribute", len(raw.Header), raw.Header)
	}
}

// TestAsyncAPIErrorsPrintNoSecret: a --destination its package refuses is
// named in the error without any of its secret, also when the password or
// token holds an unencoded '?' or '/' (the adversarial review: the NATS and
// AMQP parsers' messages quoted pieces of it, and so did the redacted URL).
func TestAsyncAPIErrorsPrintNoSecret(t *testing.T) {
	t.Parallel()
	for _, dest := range []string{
		"nats://s3cr?et@127.0.0.1:4222",
		"nats://tok3n/s3cret+x@127.0.0.1:4222",
		"nats://127.0.0.1:4222?monitor_url=http://admin:s3cret@127.0.0.1:8222",
		"amqp://g:s3c?ret@127.0.0.1:5672/",
		"ftp://u:s3cret@h/",
		"kafka://u:s3c?ret@b1:9092",
	} {
		_, err := asyncAPIDocument(dest, "t", "1")
		if err == nil {
			t.Errorf("%q: accepted", "…")
			continue
		}
		for _, piece := range []string{"s3cr", "tok3n", "ret@", "et@"} {
			if strings.Contains(err.Error(), piece) {
				t.Errorf("the error for a refused destination prints %q of its secret: %v", piece, err)
			}
		}
	}
	// The error is the destination package's, which says what is wrong:
	// the parameter, never its value.
	for dest, want := range map[string]string{
		"nats://tok@127.0.0.1:4222?stream=a.b":    "stream: invalid stream name",
		"kafka://k1:9092?tls=maybe":               "tls: not true or false",
		"amqp://g:s3cret@127.0.0.1:5672/?bogus=1": "bogus: unknown parameter",
		"https://h/s3cret?outbox_timeout=-1s":     "outbox_timeout: not a positive duration",
	} {
		_, err := asyncAPIDocument(dest, "t", "1")
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%.12s…: %v, want an error saying %q without the secret", dest, err, want)
		}
	}
	// Every hostile secret, unencoded, where each kind of URL holds one.
	for _, secret := range secrettest.Hostile {
		for _, tmpl := range []string{"nats://%s@127.0.0.1:4222?stream=a.b", "kafka://u:%s@k1:9092?tls=maybe", "amqp://g:%s@127.0.0.1:5672/?bogus=1", "https://h/%s?outbox_timeout=-1s"} {
			dest := fmt.Sprintf(tmpl, secret)
			// Some are accepted (a webhook's path holding '?' leaves the
			// rest to the endpoint's query): then the document is checked.
			doc, err := asyncAPIDocument(dest, "t", "1")
			shown := fmt.Sprint(err)
			if err == nil {
				b, _ := json.Marshal(doc)
				shown = string(b)
			}
			if run := secrettest.Leak(shown, secret); run != "" {
				t.Errorf("%.12s…: shows %q of the secret: %s", dest, run, shown)
			}
		}
	}
}
