package outboxwebhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// MaxBodyBytesDefault is the largest request body a Receiver reads: the
// writer's default payload limit.
const MaxBodyBytesDefault = outbox.MaxPayloadBytesDefault

// ReceiverOptions configure a Receiver; the zero value is the defaults.
type ReceiverOptions struct {
	// Tolerance is how far webhook-timestamp may be from the receiver's
	// clock, either way; a request outside it is refused with 401.
	// Defaults to ToleranceDefault (5 minutes).
	Tolerance time.Duration
	// MaxBodyBytes is the largest body read; a larger one is refused with
	// 413. Defaults to MaxBodyBytesDefault.
	MaxBodyBytes int64
	// Now is the clock the timestamp is checked against. Defaults to
	// time.Now.
	Now func() time.Time
	// TracerProvider receives a CONSUMER span per event handled, which
	// continues the trace of the request's traceparent header (the relay's
	// publish span) and covers the handle function, whose ctx carries it.
	// Nil means otel.GetTracerProvider() (read, never set), a no-op unless
	// the application configured one. Defaults to nil.
	TracerProvider trace.TracerProvider
}

// Receiver is an http.Handler that accepts the requests of a Publisher:
// it verifies, decodes and hands each event to a function, and answers so
// that the publishing relay retries what was not handled.
type Receiver struct {
	v      verifier
	max    int64
	handle func(ctx context.Context, msg outbox.Message) error
	tracer trace.Tracer // nil: tracing off
}

// NewReceiver returns a Receiver that, for each POST:
//
//  1. reads the body, at most opts.MaxBodyBytes (413 beyond, which the
//     relay takes as permanent);
//  2. verifies the Standard Webhooks signature against every secret
//     (any match will do, so secrets rotate by listing old and new) and the
//     timestamp against opts.Tolerance: 401 otherwise;
//  3. decodes the message with Decode: 400 when it is not an outbox event;
//  4. calls handle with the request's context (carrying a CONSUMER span
//     that continues the message's trace, see opts.TracerProvider) and
//     answers 204 when it
//     returns nil, 422 when its error is marked outbox.Permanent (the relay
//     quarantines the event), and 500 otherwise (the relay retries later),
//     with a Retry-After header (whole seconds, at least 1) when the error
//     is marked with outbox.RetryAfter, which the relay honours.
//
// Error answers carry the error's text as a plain-text body, which the
// relay records as the event's last error: keep secrets out of handle's
// errors. Other methods get 405. A malformed secret, or none, is an error
// that does not repeat it.
//
// handle may run for several events at once (of different aggregates; the
// relay sends an aggregate's next event only after this one's 2xx). To
// apply each event once, in order, handle it through an inbox (see the
// package example).
func NewReceiver(secrets []string, handle func(ctx context.Context, msg outbox.Message) error, opts ReceiverOptions) (*Receiver, error) {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("outboxwebhook: receiver: no signing secret")
	}
	if handle == nil {
		return nil, errors.New("outboxwebhook: receiver: nil handle function")
	}
	if opts.Tolerance <= 0 {
		opts.Tolerance = ToleranceDefault
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = MaxBodyBytesDefault
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Receiver{v: verifier{keys: keys, tolerance: opts.Tolerance, now: opts.Now}, max: opts.MaxBodyBytes, handle: handle,
		tracer: tracing.Tracer(opts.TracerProvider)}, nil
}

// ServeHTTP implements http.Handler.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(w, http.StatusMethodNotAllowed, "only POST delivers events")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, rc.max+1))
	if err != nil {
		fail(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if int64(len(body)) > rc.max {
		fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", rc.max))
		return
	}
	if err := rc.v.verify(r.Header, body); err != nil {
		fail(w, http.StatusUnauthorized, err.Error())
		return
	}
	msg, err := Decode(r.Header, body)
	if err != nil {
		fail(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, span := rc.startSpan(r.Context(), &msg)
	err = rc.handle(ctx, msg)
	endSpan(span, err)
	if err != nil {
		code := http.StatusInternalServerError
		if outbox.IsPermanent(err) {
			code = http.StatusUnprocessableEntity
		} else if d, ok := outbox.RetryDelay(err); ok {
			// Whole seconds, rounded up: 0 would mean "at once".
			w.Header().Set("Retry-After", strconv.FormatInt(int64(max((d+time.Second-1)/time.Second, 1)), 10))
		}
		fail(w, code, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func fail(w http.ResponseWriter, code int, msg string) {
	if len(msg) > errorBodyBytes {
		msg = msg[:errorBodyBytes]
	}
	http.Error(w, msg, code)
}
