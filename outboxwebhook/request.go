package outboxwebhook

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/pgoutbox/outbox"
)

// request builds the signed POST of msg in the publisher's mode.
func (p *Publisher) request(ctx context.Context, msg *outbox.Message) (*http.Request, error) {
	body := msg.Payload
	if p.cfg.Mode == Structured {
		var err error
		if body, err = encodeStructured(msg, p.cfg.Source); err != nil {
			return nil, fmt.Errorf("outboxwebhook: %w", err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url.String(), bytes.NewReader(body))
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("outboxwebhook: event %s: %w", msg.ID, err))
	}
	id := DeliveryID(msg)
	ts := p.now().Unix()
	if p.cfg.Mode == Structured {
		headerCopies(req.Header, msg)
		req.Header.Set(HeaderContentType, contentTypeStructuredSent)
	} else {
		if err := encodeHeader(req.Header, msg, p.cfg.Source); err != nil {
			return nil, fmt.Errorf("outboxwebhook: %w", err)
		}
		req.Header.Set(HeaderOutboxSignature, signAttributesAll(p.keys, id, ts, canonicalHeaders(req.Header), body))
	}
	req.Header.Set(HeaderWebhookID, id)
	req.Header.Set(HeaderWebhookTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderWebhookSignature, signAll(p.keys, id, ts, body))
	// An Idempotency-Key also lets net/http resend the POST on a reused
	// connection that the server had closed before reading it.
	req.Header.Set(HeaderIdempotencyKey, id)
	req.Header.Set("User-Agent", userAgent)
	return req, nil
}
