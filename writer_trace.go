package outbox

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox/internal/tracing"
)

// traceContext is the W3C trace context the writer adds to the events of
// one call: empty when the caller's context carries no valid span context,
// or the writer was told not to (WriterConfig.DisableTraceContext).
type traceContext struct {
	parent, state string
}

// traceContext reads the span context of ctx, once per call.
func (w *Writer) traceContext(ctx context.Context) traceContext {
	if w.noTrace {
		return traceContext{}
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return traceContext{}
	}
	tp, ts, _ := tracing.Encode(sc)
	return traceContext{parent: tp, state: ts}
}

// headers returns the headers to store for an event whose own headers are
// h: h with the trace context added. What the caller set wins: an event
// that has a traceparent (in any spelling) keeps its headers as they are,
// and its own tracestate is kept. The trace context is left out when it
// would take the event over MaxHeaders. h itself is never modified.
func (tc traceContext) headers(h map[string]string) map[string]string {
	if tc.parent == "" || tracing.Has(h, tracing.HeaderTraceParent) {
		return h
	}
	state := tc.state != "" && !tracing.Has(h, tracing.HeaderTraceState)
	n := len(h) + 1
	if state {
		n++
	}
	if n > MaxHeaders {
		return h
	}
	out := make(map[string]string, n)
	for k, v := range h {
		out[k] = v
	}
	out[tracing.HeaderTraceParent] = tc.parent
	if state {
		out[tracing.HeaderTraceState] = tc.state
	}
	return out
}
