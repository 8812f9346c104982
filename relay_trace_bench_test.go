package outbox

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkPublishTrace measures what tracing adds to publishing one event
// (start and end of its producer span, and the traceparent rewrite), for an
// event written with a trace context:
//
//   - "noop": RelayConfig.TracerProvider is a noop.TracerProvider (tracing
//     skipped altogether);
//   - "global-unset": TracerProvider nil and the application set no global
//     provider (the common case of a user who does not trace);
//   - "sdk": an SDK provider that samples and records every span (no
//     exporter).
//
// A batch is one Publish call's messages; ns/event includes copying each
// message into the batch, as the relay does anyway.
func BenchmarkPublishTrace(b *testing.B) {
	msg := Message{ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: "o-1", Sequence: 7, Type: "OrderCreated",
		Headers: map[string]string{"traceparent": "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"}}
	sdk := sdktrace.NewTracerProvider()
	defer func() { _ = sdk.Shutdown(b.Context()) }()
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"noop", noop.NewTracerProvider()},
		{"global-unset", otel.GetTracerProvider()},
		{"sdk", sdk},
	} {
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/batch=%d", tc.name, n), func(b *testing.B) {
				pt := newPublishTracer(tc.tp, nil)
				msgs := make([]Message, n)
				b.ReportAllocs()
				for b.Loop() {
					for i := range msgs {
						msgs[i] = msg
					}
					endAll(pt.startAll(msgs), nil)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
			})
		}
	}
}
