package destination

import (
	"context"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// openWebhook opens an HTTP webhook publisher (outboxwebhook), signing with
// the secrets in OUTBOX_WEBHOOK_SECRET, and waits, as OpenWait does, until
// the endpoint answers a HEAD request. The URL's outbox_source option, when
// set, wins over --source.
func openWebhook(ctx context.Context, o Options, retry func(ctx context.Context, err error) error) (outbox.Publisher, func(), error) {
	cfg, err := outboxwebhook.ParseURL(o.URL)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Source == "" {
		cfg.Source = o.Source
	}
	p, err := outboxwebhook.NewPublisher(cfg)
	if err != nil {
		return nil, nil, err
	}
	return probed(ctx, p, retry)
}
