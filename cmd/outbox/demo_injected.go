package main

// The demo labels what it injects: every log line a fault injected by the
// demo causes carries injected=true, so that a reader tells the faults the
// demo makes on purpose (the dropped consumer acks of --lost-acks, the
// payment provider's --provider-faults) from real trouble.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/sideeffect"
)

// injectedAttr is the attribute of a log line caused by an injected fault.
const injectedAttr = "injected"

// injectedMarker starts the text of an error the demo's provider client
// returns for a request the provider injected a fault into (the provider's
// own answers to injected failures say it likewise).
const injectedMarker = "injected fault"

// injectedHandler adds injected=true to the records whose attributes carry
// an error (or a text) caused by an injected fault: failpoint.ErrInjected,
// or an error naming injectedMarker. It remembers the orders such a record
// was about (order_id): a later record of the same order whose error is an
// unknown or parked outcome, or a call still in flight, is the same
// fault's consequence (a parked charge redelivered) and is labelled too.
type injectedHandler struct {
	slog.Handler
	orders *sync.Map // order ids an injected fault hit
}

// newInjectedHandler wraps h.
func newInjectedHandler(h slog.Handler) injectedHandler {
	return injectedHandler{Handler: h, orders: new(sync.Map)}
}

// Handle labels r when an injected fault caused it.
func (h injectedHandler) Handle(ctx context.Context, r slog.Record) error {
	injected, labelled, consequence := false, false, false
	order := ""
	r.Attrs(func(a slog.Attr) bool {
		labelled = labelled || a.Key == injectedAttr
		injected = injected || causedByInjection(a.Value)
		consequence = consequence || isConsequence(a.Value)
		if a.Key == "order_id" {
			order = a.Value.String()
		}
		return true
	})
	if order != "" {
		if injected {
			h.orders.Store(order, true)
		} else if _, hit := h.orders.Load(order); hit && consequence {
			injected = true
		}
	}
	if injected && !labelled {
		r = r.Clone()
		r.AddAttrs(slog.Bool(injectedAttr, true))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs keeps the labelling on the derived handler.
func (h injectedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return injectedHandler{h.Handler.WithAttrs(attrs), h.orders}
}

// WithGroup keeps the labelling on the derived handler.
func (h injectedHandler) WithGroup(name string) slog.Handler {
	return injectedHandler{h.Handler.WithGroup(name), h.orders}
}

// isConsequence says whether a log attribute's value is an error that an
// earlier ambiguous call leads to: the outcome unknown or parked, or the
// attempt still held by a caller.
func isConsequence(v slog.Value) bool {
	err, ok := v.Resolve().Any().(error)
	if !ok {
		return false
	}
	for _, e := range []error{sideeffect.ErrUnknown, sideeffect.ErrParked, sideeffect.ErrInProgress} {
		if errors.Is(err, e) || strings.Contains(err.Error(), e.Error()) {
			return true
		}
	}
	return false
}

// causedByInjection says whether a log attribute's value is an error or a
// text caused by an injected fault.
func causedByInjection(v slog.Value) bool {
	v = v.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		for _, a := range v.Group() {
			if causedByInjection(a.Value) {
				return true
			}
		}
	case slog.KindString:
		return strings.Contains(v.String(), injectedMarker)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return errors.Is(err, failpoint.ErrInjected) || strings.Contains(err.Error(), injectedMarker)
		}
	}
	return false
}

// demoCallHeader numbers the demo's requests to its provider, so that the
// faults the provider draws can be told to the client that sent them.
const demoCallHeader = "X-Outbox-Demo-Call"

// injectedFaults links the provider's injected faults (provider.Config's
// OnFault) to the requests of the payments consumer's client (transport),
// whose transport errors then say they were injected.
type injectedFaults struct {
	next   atomic.Int64
	mu     sync.Mutex
	faults map[string]provider.FaultKind
}

// onFault records the fault the provider drew for r.
func (f *injectedFaults) onFault(r *http.Request, kind provider.FaultKind) {
	id := r.Header.Get(demoCallHeader)
	if id == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.faults == nil {
		f.faults = map[string]provider.FaultKind{}
	}
	f.faults[id] = kind
}

// take returns and forgets the fault drawn for the request id, if any.
func (f *injectedFaults) take(id string) (provider.FaultKind, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kind, ok := f.faults[id]
	delete(f.faults, id)
	return kind, ok
}

// transport numbers each request and labels the error of one the provider
// injected a fault into (a dropped response, a hang past the client's
// timeout, a crash): "injected fault (drop-response): <the error>".
func (f *injectedFaults) transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		id := strconv.FormatInt(f.next.Add(1), 10)
		r = r.Clone(r.Context())
		r.Header.Set(demoCallHeader, id)
		resp, err := base.RoundTrip(r)
		kind, injected := f.take(id)
		if err != nil && injected {
			return resp, fmt.Errorf("%s (%s): %w", injectedMarker, kind, err)
		}
		return resp, err
	})
}

// roundTripFunc is a function as an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
