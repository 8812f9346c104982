package tracing_test

import (
	"context"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox/internal/tracing"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestFromHeadersAnySpelling(t *testing.T) {
	t.Parallel()
	for _, h := range []map[string]string{
		{"traceparent": parent},
		{"Traceparent": parent, "x": "y"}, // NATS and HTTP may canonicalise the name
		{"TRACEPARENT": parent, "Tracestate": "a=b"},
	} {
		sc := tracing.FromHeaders(h)
		if !sc.IsValid() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsRemote() {
			t.Errorf("FromHeaders(%v) = %v", h, sc)
		}
	}
	for _, h := range []map[string]string{nil, {}, {"traceparent": "garbage"}, {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}} {
		if sc := tracing.FromHeaders(h); sc.IsValid() {
			t.Errorf("FromHeaders(%v) is valid: %v", h, sc)
		}
	}
}

func TestWithSpanContextReplacesEverySpelling(t *testing.T) {
	t.Parallel()
	in := map[string]string{"Traceparent": "old", "TraceState": "old=1", "x-tenant": "t1"}
	orig := maps.Clone(in)
	sc := tracing.FromHeaders(map[string]string{"traceparent": parent})
	out := tracing.WithSpanContext(in, sc)
	want := map[string]string{"traceparent": parent, "x-tenant": "t1"}
	if !maps.Equal(out, want) {
		t.Errorf("WithSpanContext = %v, want %v", out, want)
	}
	if !maps.Equal(in, orig) {
		t.Errorf("the input map was modified: %v", in)
	}
	if got := tracing.WithSpanContext(in, trace.SpanContext{}); !maps.Equal(got, in) {
		t.Errorf("an invalid span context changed the headers: %v", got)
	}
}

func TestConsumerStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msg := map[string]string{"traceparent": parent}
	remote := tracing.FromHeaders(msg)

	// No trace in the message: ctx as it is.
	if got, links := tracing.ConsumerStart(ctx, nil); got != ctx || links != nil {
		t.Errorf("no trace context: ctx changed or links %v", links)
	}
	// Nothing in ctx: the message's context is the parent.
	got, links := tracing.ConsumerStart(ctx, msg)
	if !trace.SpanContextFromContext(got).Equal(remote) || links != nil {
		t.Errorf("empty ctx: parent %v, links %v", trace.SpanContextFromContext(got), links)
	}
	// A span of the same trace in ctx stays the parent.
	same := trace.NewSpanContext(trace.SpanContextConfig{TraceID: remote.TraceID(), SpanID: trace.SpanID{9}, TraceFlags: 1})
	in := trace.ContextWithSpanContext(ctx, same)
	if got, links := tracing.ConsumerStart(in, msg); got != in || links != nil {
		t.Errorf("same trace in ctx: replaced, links %v", links)
	}
	// A span of another trace is linked, the message's context is the parent.
	other := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{7}, SpanID: trace.SpanID{9}, TraceFlags: 1})
	got, links = tracing.ConsumerStart(trace.ContextWithSpanContext(ctx, other), msg)
	if !trace.SpanContextFromContext(got).Equal(remote) || len(links) != 1 || !links[0].SpanContext.Equal(other) {
		t.Errorf("other trace in ctx: parent %v, links %v", trace.SpanContextFromContext(got), links)
	}
}
