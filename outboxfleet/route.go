package outboxfleet

// Routes by aggregate type. An aggregate's events all carry its aggregate
// type, so routing by that type sends every event of an aggregate to the
// same destination, and the relay's per-aggregate order (I5) holds there:
// the relay still publishes k+1 only after k was acknowledged (or, to a
// destination that pipelines in order, in one call after k), whichever
// destination that is. Routing by anything else (the event type, the
// payload) could split an aggregate over two destinations and is not
// offered.

import (
	"context"
	"fmt"
	"sync"

	"github.com/pgoutbox/outbox"
)

// routed is the publisher of a source with routes.
type routed struct {
	byType   map[string]int // aggregate type -> index into dests
	fallback int            // the route without aggregate types; -1: none
	dests    []outbox.Publisher
	names    []string
}

func newRouted(routes []Route, pubs map[string]outbox.Publisher) *routed {
	r := &routed{byType: map[string]int{}, fallback: -1}
	for i, rt := range routes {
		r.dests = append(r.dests, pubs[rt.Destination])
		r.names = append(r.names, rt.Destination)
		if len(rt.AggregateTypes) == 0 {
			r.fallback = i
		}
		for _, t := range rt.AggregateTypes {
			r.byType[t] = i
		}
	}
	return r
}

// route returns the index of the route of an aggregate type, or -1.
func (r *routed) route(aggregateType string) int {
	if i, ok := r.byType[aggregateType]; ok {
		return i
	}
	return r.fallback
}

// Publish sends each message to its route's destination, the destinations
// concurrently. A destination that cannot be reached fails its messages
// with outbox.RouteUnavailable (route "destination <name>"): the relay holds
// that route's events without spending attempts and goes on publishing the
// others. A message whose aggregate type has no route fails as permanent
// (it is quarantined; add a route and retry it).
func (r *routed) Publish(ctx context.Context, msgs []outbox.Message) []error {
	groups := make([][]int, len(r.dests))
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(msgs))
		}
		errs[i] = err
	}
	for i, m := range msgs {
		k := r.route(m.AggregateType)
		if k < 0 {
			fail(i, outbox.Permanent(fmt.Errorf("aggregate type %q has no route in the fleet configuration", m.AggregateType)))
			continue
		}
		groups[k] = append(groups[k], i)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k, idx := range groups {
		if len(idx) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := make([]outbox.Message, len(idx))
			for j, i := range idx {
				part[j] = msgs[i]
			}
			res := r.dests[k].Publish(ctx, part)
			if res == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for j, err := range res {
				if err == nil {
					continue
				}
				if _, isRoute := outbox.UnavailableRoute(err); outbox.IsUnavailable(err) && !isRoute {
					err = outbox.RouteUnavailable("destination "+r.names[k], err)
				}
				fail(idx[j], err)
			}
		}()
	}
	wg.Wait()
	return errs
}

// OrderedPipelining reports whether every destination pipelines in order:
// then the relay passes a lane's events in one call, and they stay in one
// group (one aggregate type, one destination), in order.
func (r *routed) OrderedPipelining() bool {
	for _, p := range r.dests {
		op, ok := p.(outbox.OrderedPipeliner)
		if !ok || !op.OrderedPipelining() {
			return false
		}
	}
	return true
}
