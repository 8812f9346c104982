package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// sqlEnqueueCases are events the Go writer refuses or accepts; the SQL
// write API (migration 011) must decide each the same way.
func sqlEnqueueCases() map[string]outbox.Event {
	ev := func(mod func(*outbox.Event)) outbox.Event {
		e := outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{"a":1}`)}
		mod(&e)
		return e
	}
	many := map[string]string{}
	for i := range outbox.MaxHeaders + 1 {
		many[fmt.Sprintf("x-h%d", i)] = "v"
	}
	return map[string]outbox.Event{
		"good":                           ev(func(*outbox.Event) {}),
		"empty aggregate type":           ev(func(e *outbox.Event) { e.AggregateType = "" }),
		"empty aggregate id":             ev(func(e *outbox.Event) { e.AggregateID = "" }),
		"empty event type":               ev(func(e *outbox.Event) { e.Type = "" }),
		"aggregate id over the limit":    ev(func(e *outbox.Event) { e.AggregateID = strings.Repeat("x", outbox.MaxAggregateIDBytes+1) }),
		"aggregate id at the limit":      ev(func(e *outbox.Event) { e.AggregateID = strings.Repeat("é", outbox.MaxAggregateIDBytes/2) }),
		"aggregate type over the limit":  ev(func(e *outbox.Event) { e.AggregateType = strings.Repeat("x", outbox.MaxNameBytes+1) }),
		"event type with a tab":          ev(func(e *outbox.Event) { e.Type = "Pla\tced" }),
		"aggregate id with DEL":          ev(func(e *outbox.Event) { e.AggregateID = "o\x7f" }),
		"aggregate id with U+001F":       ev(func(e *outbox.Event) { e.AggregateID = "o\x1fx" }),
		"negative schema version":        ev(func(e *outbox.Event) { e.SchemaVersion = -1 }),
		"schema version 7":               ev(func(e *outbox.Event) { e.SchemaVersion = 7 }),
		"content type token with braces": ev(func(e *outbox.Event) { e.ContentType = "application/x{v1}"; e.Payload = []byte("x") }),
		"content type value with braces": ev(func(e *outbox.Event) { e.ContentType = "text/plain; v={1}"; e.Payload = []byte("x") }),
		"payload over 1 MiB": ev(func(e *outbox.Event) {
			e.Payload = []byte(`"` + strings.Repeat("x", outbox.MaxPayloadBytesDefault) + `"`)
		}),
		"invalid JSON":                   ev(func(e *outbox.Event) { e.Payload = []byte(`{"a":`) }),
		"two JSON documents":             ev(func(e *outbox.Event) { e.Payload = []byte(`{} {}`) }),
		"empty payload":                  ev(func(e *outbox.Event) { e.Payload = nil }),
		"JSON null":                      ev(func(e *outbox.Event) { e.Payload = []byte(`null`) }),
		"huge exponent":                  ev(func(e *outbox.Event) { e.Payload = []byte(`1e1000000`) }),
		"payload with NUL byte":          ev(func(e *outbox.Event) { e.Payload = []byte("{\"a\":\"\x00\"}") }),
		"payload not UTF-8":              ev(func(e *outbox.Event) { e.Payload = []byte("\"\xff\"") }),
		"escaped NUL":                    ev(func(e *outbox.Event) { e.Payload = []byte(`{"a":"\u0000"}`) }),
		"escaped backslash before u0000": ev(func(e *outbox.Event) { e.Payload = []byte(`{"a":"\\u0000"}`) }),
		"lone high surrogate":            ev(func(e *outbox.Event) { e.Payload = []byte(`{"a":"\ud800x"}`) }),
		"lone low surrogate":             ev(func(e *outbox.Event) { e.Payload = []byte(`{"a":"\udc00"}`) }),
		"surrogate pair":                 ev(func(e *outbox.Event) { e.Payload = []byte(`{"a":"\ud83d\ude00"}`) }),
		"control character in a string":  ev(func(e *outbox.Event) { e.Payload = []byte("{\"a\":\"\n\"}") }),
		"leading zero":                   ev(func(e *outbox.Event) { e.Payload = []byte(`01`) }),
		"protobuf, empty":                ev(func(e *outbox.Event) { e.ContentType = "application/protobuf"; e.Payload = nil }),
		"protobuf, binary":               ev(func(e *outbox.Event) { e.ContentType = "application/protobuf"; e.Payload = []byte{0, 0xff, 1} }),
		"+json type, invalid":            ev(func(e *outbox.Event) { e.ContentType = "application/cloudevents+json"; e.Payload = []byte(`x`) }),
		"JSON with charset":              ev(func(e *outbox.Event) { e.ContentType = `application/json; charset="utf-8"`; e.Payload = []byte(`x`) }),
		"content type with params":       ev(func(e *outbox.Event) { e.ContentType = `text/plain; a=b ; c="d\"e";`; e.Payload = []byte(`x`) }),
		"content type one token":         ev(func(e *outbox.Event) { e.ContentType = "text"; e.Payload = []byte(`x`) }),
		"content type blank":             ev(func(e *outbox.Event) { e.ContentType = " "; e.Payload = []byte(`x`) }),
		"content type no subtype":        ev(func(e *outbox.Event) { e.ContentType = "text/"; e.Payload = []byte(`x`) }),
		"content type junk after":        ev(func(e *outbox.Event) { e.ContentType = "text/plain x"; e.Payload = []byte(`x`) }),
		"content type bad param":         ev(func(e *outbox.Event) { e.ContentType = "text/plain; a"; e.Payload = []byte(`x`) }),
		"content type two semicolons":    ev(func(e *outbox.Event) { e.ContentType = "text/plain;;"; e.Payload = []byte(`x`) }),
		"content type duplicate param":   ev(func(e *outbox.Event) { e.ContentType = "text/plain; a=b; A=c"; e.Payload = []byte(`x`) }),
		"content type same param twice":  ev(func(e *outbox.Event) { e.ContentType = `text/plain; a=b; A="b"`; e.Payload = []byte(`x`) }),
		"content type unterminated":      ev(func(e *outbox.Event) { e.ContentType = `text/plain; a="b`; e.Payload = []byte(`x`) }),
		"content type not ASCII":         ev(func(e *outbox.Event) { e.ContentType = "text/plaîn"; e.Payload = []byte(`x`) }),
		"content type over the limit":    ev(func(e *outbox.Event) { e.ContentType = "text/" + strings.Repeat("x", 251); e.Payload = []byte(`x`) }),
		"header good":                    ev(func(e *outbox.Event) { e.Headers = map[string]string{"x-tenant": "t 1"} }),
		"header empty name":              ev(func(e *outbox.Event) { e.Headers = map[string]string{"": "v"} }),
		"header name with a space":       ev(func(e *outbox.Event) { e.Headers = map[string]string{"x tenant": "v"} }),
		"header name reserved ce-":       ev(func(e *outbox.Event) { e.Headers = map[string]string{"CE-id": "v"} }),
		"header name reserved nats-":     ev(func(e *outbox.Event) { e.Headers = map[string]string{"Nats-Msg-Id": "v"} }),
		"header content-type":            ev(func(e *outbox.Event) { e.Headers = map[string]string{"Content-Type": "v"} }),
		"header value too long": ev(func(e *outbox.Event) {
			e.Headers = map[string]string{"x": strings.Repeat("v", outbox.MaxHeaderValueBytes+1)}
		}),
		"header value trailing space": ev(func(e *outbox.Event) { e.Headers = map[string]string{"x": "v "} }),
		"header value leading NBSP":   ev(func(e *outbox.Event) { e.Headers = map[string]string{"x": "\u00a0v"} }),
		"header value with a newline": ev(func(e *outbox.Event) { e.Headers = map[string]string{"x": "a\nb"} }),
		"header value empty":          ev(func(e *outbox.Event) { e.Headers = map[string]string{"x": ""} }),
		"too many headers":            ev(func(e *outbox.Event) { e.Headers = many }),
		"traceparent header": ev(func(e *outbox.Event) {
			e.Headers = map[string]string{"traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}
		}),
	}
}

// goRefusal returns the field part of the Go writer's refusal of ev
// ("aggregate id", "payload", "header x", ...), or "" when it accepts ev.
func goRefusal(t *testing.T, ev outbox.Event) string {
	err := ev.Validate()
	if err == nil {
		return ""
	}
	if !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("Validate: %v, not ErrInvalidEvent", err)
	}
	_, detail, _ := strings.Cut(err.Error(), ": ")
	return fieldOf(detail)
}

// fieldOf is the words of an invalid-event message that name the field:
// the first two ("aggregate id", "payload: not", "header name", "header x:").
func fieldOf(detail string) string {
	words := strings.Fields(detail)
	if len(words) > 2 {
		words = words[:2]
	}
	s := strings.Join(words, " ")
	if strings.HasPrefix(s, "payload:") || strings.HasPrefix(s, "payload ") {
		return "payload"
	}
	return s
}

// TestSQLEnqueueAgreesWithTheWriter runs the writer's refusal table through
// Event.Validate (what InsertTx checks) and through the SQL write API, one
// event through enqueue and through enqueue_many: each refuses the same
// events, with SQLSTATE 22023, a message naming the same field and the
// argument in the error's COLUMN field, and leaves nothing written.
func TestSQLEnqueueAgreesWithTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for name, ev := range sqlEnqueueCases() {
		want := goRefusal(t, ev)
		headers := "{}"
		if ev.Headers != nil {
			b, _ := json.Marshal(ev.Headers)
			headers = string(b)
		}
		var ct any
		if ev.ContentType != "" {
			ct = ev.ContentType
		}
		payload := ev.Payload
		if payload == nil {
			payload = []byte{}
		}
		doc, _ := json.Marshal([]map[string]any{{"aggregate_type": ev.AggregateType, "aggregate_id": ev.AggregateID,
			"event_type": ev.Type, "schema_version": ev.SchemaVersion, "content_type": ct, "payload_base64": payload, "headers": ev.Headers}})
		for form, call := range map[string]func(tx pgx.Tx) error{
			"enqueue": func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT * FROM `+schema+`.enqueue($1::text, $2::text, $3::text, $4::bytea,
					content_type => $5::text, headers => $6::jsonb, schema_version => $7::int)`,
					ev.AggregateType, ev.AggregateID, ev.Type, payload, ct, headers, ev.SchemaVersion)
				return err
			},
			"enqueue_many": func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT * FROM `+schema+`.enqueue_many($1::jsonb)`, string(doc))
				return err
			},
		} {
			t.Run(name+"/"+form, func(t *testing.T) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				err = call(tx)
				if want == "" {
					if err != nil {
						t.Fatalf("Go accepts the event, %s refuses it: %v", form, err)
					}
					return
				}
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					t.Fatalf("Go refuses the event (%s), %s: %v", want, form, err)
				}
				_, detail, _ := strings.Cut(pgErr.Message, ": ")
				if pgErr.Code != "22023" || !strings.HasPrefix(pgErr.Message, "invalid event 0: ") || fieldOf(detail) != want || pgErr.ColumnName == "" {
					t.Fatalf("Go refuses the event (%s); %s: SQLSTATE %s, column %q, %q", want, form, pgErr.Code, pgErr.ColumnName, pgErr.Message)
				}
			})
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_events").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events left (%v)", n, err)
	}
}

// TestWakeNotifiesTheRelaysChannel: outbox.wake() notifies the channel the
// schema's relays listen on (outbox.NotifyChannel), also for a schema name
// long enough that the channel carries a hash of it.
func TestWakeNotifiesTheRelaysChannel(t *testing.T) {
	t.Parallel()
	for _, name := range []string{outboxtest.UniqueName(t, "w"), (outboxtest.UniqueName(t, "w") + strings.Repeat("x", 63))[:63]} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		pool, schema := outboxtest.SchemaNamed(t, name)
		conn, err := pgx.Connect(ctx, outboxtest.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel(schema)}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "SELECT "+schema+".wake()"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.WaitForNotification(ctx); err != nil {
			t.Fatalf("schema %s (%d bytes): no notification on %s: %v", schema, len(schema), outbox.NotifyChannel(schema), err)
		}
	}
}
