package chaos

import (
	"context"
	"strings"
	"sync"

	"github.com/pgoutbox/outbox/examples/orders/provider"
)

// sagaDestination says whether the destination carries the saga (its
// consumers read NATS JetStream).
func sagaDestination(d Destination) bool {
	scheme, _, _ := strings.Cut(d.URL(), "://")
	return scheme == "nats" || scheme == "tls"
}

// ledger reads the provider's whole ledger.
func (r *run) ledger(ctx context.Context) (provider.Ledger, error) {
	return r.sys.ProviderClient().Ledger(ctx, "")
}

// provider sets fault f's rule on the provider, and clears it after f.For.
func (r *run) provider(ctx context.Context, f Fault, pending *sync.WaitGroup) {
	if err := r.sys.setProviderFaults(ctx, f.Rule); err != nil {
		r.printf("  %v\n", err) // the provider is down (killed): no fault this time
		return
	}
	r.count(func(s *Stats) { s.ProviderFaults++ })
	pending.Go(func() {
		sleepCtx(ctx, f.For)
		_ = r.sys.setProviderFaults(context.WithoutCancel(ctx), "")
	})
}

// clearProviderFaults clears the provider's faults for the recovery (a
// restarted provider has none anyway).
func (r *run) clearProviderFaults(ctx context.Context) {
	if err := r.sys.setProviderFaults(ctx, ""); err != nil {
		r.printf("  clear the provider's faults: %v\n", err)
	}
}
