package outboxkafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
)

// Probe reports whether the cluster can be reached now, without producing:
// it sends one metadata request for no topics (the cheapest request that
// names the brokers), bounded by ctx or, when ctx has no deadline, by
// DeliveryTimeout. It returns nil when a broker answers with at least one
// broker in the cluster, and an error marked outbox.Unavailable otherwise. It
// implements outbox.Prober, which a relay uses to leave an outage while it
// has nothing to publish.
func (p *Publisher) Probe(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
		defer cancel()
	}
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{} // none, not all
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		return outbox.Unavailable(fmt.Errorf("outboxkafka: probe: %w", err))
	}
	if len(resp.Brokers) == 0 {
		return outbox.Unavailable(errors.New("outboxkafka: probe: the cluster names no brokers"))
	}
	return nil
}
