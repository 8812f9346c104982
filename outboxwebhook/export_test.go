package outboxwebhook

import (
	"net/http"
	"strconv"
	"time"
)

// SetClock sets the clock a Publisher takes its webhook-timestamps from.
func SetClock(p *Publisher, now func() time.Time) { p.now = now }

// SignRequest (re)signs a request's header and body as a Publisher would
// at ts: webhook-timestamp, webhook-signature and, in binary mode,
// webhook-outbox-signature over the header as it is.
func SignRequest(secrets []string, h http.Header, ts time.Time, body []byte) error {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return err
	}
	id := h.Get(HeaderWebhookID)
	h.Set(HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderWebhookSignature, signAll(keys, id, ts.Unix(), body))
	h.Del(HeaderOutboxSignature)
	if !isStructured(h) {
		h.Set(HeaderOutboxSignature, signAttributesAll(keys, id, ts.Unix(), canonicalHeaders(h), body))
	}
	return nil
}
