package ordersapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// writtenEvent is what a relay reads of an order event, less its ids and
// times.
type writtenEvent struct {
	Type, ContentType, TraceParent, TraceState string
	Sequence                                   int64
	Payload                                    string
}

// TestWritersWriteAlike runs the same commands (a traced create, a
// cancellation, a create naming an unknown SKU) through a service of each
// Config.Writer and requires the same event rows: with WriterSQL the
// service has no outbox.Writer, the rolled-back create leaves nothing, and
// the request's trace context reaches the row as with the Go writer.
func TestWritersWriteAlike(t *testing.T) {
	t.Parallel()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
		TraceState: must(trace.ParseTraceState("vendor=x1")),
	})
	got := map[string][]writtenEvent{}
	for _, kind := range []string{ordersapi.WriterGo, ordersapi.WriterSQL} {
		pool, schema := outboxtest.Schema(t)
		svc, err := ordersapi.New(pool, ordersapi.Config{Schema: schema, Writer: kind})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := svc.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if (svc.Writer() == nil) != (kind == ordersapi.WriterSQL) {
			t.Errorf("writer %s: the service's outbox.Writer is %v", kind, svc.Writer())
		}
		req := ordersapi.CreateRequest{CustomerID: "c-1", Items: []ordersapi.Item{{SKU: "SKU-1001", Quantity: 2}}}
		o, _, err := svc.Create(trace.ContextWithSpanContext(ctx, sc), "", req)
		if err != nil {
			t.Fatalf("writer %s: create: %v", kind, err)
		}
		if _, err := svc.Cancel(ctx, o.ID); err != nil {
			t.Fatalf("writer %s: cancel: %v", kind, err)
		}
		bad := ordersapi.CreateRequest{CustomerID: "c-1", Items: []ordersapi.Item{{SKU: "NOPE-1", Quantity: 1}}}
		if _, _, err := svc.Create(ctx, "", bad); err == nil || !strings.Contains(err.Error(), "NOPE-1") {
			t.Fatalf("writer %s: an unknown SKU gave %v", kind, err)
		}
		if s := svc.Stats(); s.Created != 1 || s.Cancelled != 1 || s.RolledBack != 1 {
			t.Errorf("writer %s: stats %+v", kind, s)
		}
		rows, err := pool.Query(ctx, `SELECT event_type, coalesce(content_type, ''), coalesce(headers->>'traceparent', ''),
	coalesce(headers->>'tracestate', ''), aggregate_sequence, convert_from(payload_bytes, 'UTF8'), aggregate_id
FROM `+pgx.Identifier{schema, "outbox_events"}.Sanitize()+` ORDER BY aggregate_type, aggregate_id, aggregate_sequence`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var ev writtenEvent
			var aggregateID string
			if err := rows.Scan(&ev.Type, &ev.ContentType, &ev.TraceParent, &ev.TraceState, &ev.Sequence, &ev.Payload, &aggregateID); err != nil {
				t.Fatal(err)
			}
			if aggregateID != o.ID {
				t.Errorf("writer %s: an event of aggregate %s, not the order %s", kind, aggregateID, o.ID)
			}
			// The payloads name the order and its times: keep their shape.
			var fields map[string]any
			if err := json.Unmarshal([]byte(ev.Payload), &fields); err != nil {
				t.Fatalf("writer %s: payload %s: %v", kind, ev.Payload, err)
			}
			ev.Payload = strings.ReplaceAll(ev.Payload, o.ID, "ORDER")
			for _, k := range []string{"created_at", "cancelled_at"} {
				if v, ok := fields[k].(string); ok {
					ev.Payload = strings.ReplaceAll(ev.Payload, v, k)
				}
			}
			got[kind] = append(got[kind], ev)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := []writtenEvent{
		{Type: orderevents.OrderCreated, TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "vendor=x1", Sequence: 1},
		{Type: orderevents.OrderCancelled, Sequence: 2},
	}
	for kind, evs := range got {
		if len(evs) != len(want) {
			t.Fatalf("writer %s: %d events, want %d: %+v", kind, len(evs), len(want), evs)
		}
		for i, ev := range evs {
			w := want[i]
			w.Payload = ev.Payload
			if ev != w {
				t.Errorf("writer %s: event %d is %+v, want %+v", kind, i, ev, w)
			}
		}
	}
	for i := range want {
		if g, s := got[ordersapi.WriterGo][i], got[ordersapi.WriterSQL][i]; g != s {
			t.Errorf("event %d: the Go writer wrote %+v, the SQL writer %+v", i, g, s)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestUnknownWriterRefused: a Config.Writer other than go and sql is an
// error of New, naming it.
func TestUnknownWriterRefused(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	if _, err := ordersapi.New(pool, ordersapi.Config{Schema: schema, Writer: "python"}); err == nil || !strings.Contains(err.Error(), `"python"`) {
		t.Fatalf("writer python: %v", err)
	}
}
