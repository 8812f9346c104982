package destination

import (
	"context"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// openAMQP opens a RabbitMQ publisher (outboxamqp) and waits, as OpenWait
// does, until the broker answers and the exchange exists (declaring it
// unless the URL says declare=false). The URL's source parameter, when set,
// wins over --source; the password comes from the URL or from
// OUTBOX_AMQP_PASSWORD, and no error repeats it.
func openAMQP(ctx context.Context, o Options, retry func(ctx context.Context, err error) error) (outbox.Publisher, func(), error) {
	cfg, err := outboxamqp.ParseURL(o.URL)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Source == "" {
		cfg.Source = o.Source
	}
	p, err := outboxamqp.NewPublisher(cfg)
	if err != nil {
		return nil, nil, err
	}
	return probed(ctx, p, retry)
}
