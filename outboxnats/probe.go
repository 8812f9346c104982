package outboxnats

import (
	"context"
	"fmt"
)

// Probe reports whether the stream can take messages now, without
// publishing: it fails fast while the connection is down, and otherwise asks
// the server for the stream's info (one JetStream API request that stores
// nothing), bounded by ctx or, when ctx has no deadline, by AckTimeout. It
// returns nil when the stream answers and still accepts acknowledged
// publishes, an error marked outbox.Unavailable when the server, JetStream
// or the stream cannot be reached (as Publish would classify it), and
// another error when the stream exists but cannot be used. It implements
// outbox.Prober, which a relay uses to leave an outage while it has nothing
// to publish.
func (p *Publisher) Probe(ctx context.Context) error {
	if err := p.connected(); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.AckTimeout)
		defer cancel()
	}
	s, err := p.admin.Stream(ctx, p.cfg.Stream)
	if err != nil {
		return classifyAdmin(fmt.Errorf("outboxnats: probe stream %s: %w", p.cfg.Stream, err))
	}
	return checkStream(s.CachedInfo(), p.cfg)
}
