package outboxwebhook

import (
	"context"
	"net/http"

	"github.com/pgoutbox/outbox"
)

// Probe reports whether the endpoint can be reached now, without posting
// an event: it sends one HEAD request to the URL, bounded by ctx or, when
// ctx has no deadline, by Config.Timeout. Any HTTP answer, whatever its
// status (405 included), counts as reachable and returns nil; no answer
// (DNS, connection refused, TLS handshake, timeout) returns an error marked
// outbox.Unavailable. It implements outbox.Prober.
func (p *Publisher) Probe(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, p.url.String(), nil)
	if err != nil {
		return outbox.Unavailable(err)
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := p.client.Do(req)
	if err != nil {
		return p.transportError("probe", err, false) // marked Unavailable
	}
	resp.Body.Close()
	return nil
}
