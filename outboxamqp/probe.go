package outboxamqp

import (
	"context"
	"fmt"
)

// Probe reports whether the broker can be used now, without publishing: it
// connects if need be (declaring the exchange unless Config.NoDeclare) and
// checks on a channel that the exchange exists (a passive declare), bounded
// by ctx or, when ctx has no deadline, by ConfirmTimeout. It returns nil
// when the exchange is there, an error marked outbox.Unavailable when the
// broker cannot be reached, and a plain error when it answers but the
// exchange does not exist. It implements outbox.Prober, which a relay uses
// to leave an outage while it has nothing to publish.
func (p *Publisher) Probe(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxamqp: probe: %w", context.Cause(ctx))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
		defer cancel()
	}
	s, err := p.session(ctx)
	if err != nil {
		return err // unavailable, naming the broker
	}
	err = rpc(ctx, s.conn, func() error {
		return s.ch.ExchangeDeclarePassive(p.cfg.Exchange, "topic", true, false, false, false, nil)
	})
	p.release(s, err == nil)
	if err != nil {
		err = fmt.Errorf("outboxamqp: probe: exchange %q: %w", p.cfg.Exchange, err)
		if s.conn.IsClosed() || ctx.Err() != nil {
			return p.unavailable(err)
		}
		return err
	}
	return nil
}
