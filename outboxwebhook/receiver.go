package outboxwebhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// MaxBodyBytesDefault is the largest request body a Receiver reads: room
// for a payload of the writer's default limit in structured mode, as
// data_base64 (4/3 of its size), with its attributes and headers.
const MaxBodyBytesDefault = outbox.MaxPayloadBytesDefault*4/3 + 64<<10

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
	// time.Now. The Receiver reads it once per request, for both the
	// timestamp check and the memory of handled deliveries, and never lets
	// it go back: after the clock steps back, it holds still until the
	// clock catches up (a copy that the memory forgot as out of tolerance
	// must not become acceptable again).
	Now func() time.Time
	// Mode is the content mode the Receiver accepts: Structured (the
	// default) or Binary, as the publishing relay's Config.Mode
	// (outbox_mode). A request in the other mode is refused with 401
	// (ErrModeMismatch), which the relay takes as the endpoint being
	// unavailable. The mode is configured rather than read from the
	// request because the signature of the body does not cover the
	// Content-Type that says it: a captured binary-mode request re-sent
	// as structured mode would have its payload read as the event's
	// attributes. To move from one mode to the other, serve a Receiver of
	// each mode at its own path and move the relay's URL.
	Mode Mode
	// Remember is how many handled deliveries the Receiver remembers, so
	// that a copy of a request it answered 2xx (the relay's retry after
	// a lost answer, or a replay of a captured request) is answered 204
	// again without calling handle. Each is remembered until its
	// webhook-timestamp leaves the Tolerance, after which a copy is
	// refused anyway. The memory holds at most Remember deliveries (about
	// 200 bytes each). When it is full, the delivery whose timestamp is
	// oldest is forgotten, and from then on a delivery the Receiver does
	// not remember whose timestamp is not newer than the forgotten one's
	// is refused with 503 and Retry-After: 1 (it may be a copy of the one
	// forgotten; the relay sends it again with a new timestamp), so a
	// copy is never handled twice within the tolerance. Defaults to
	// RememberDefault; negative turns the memory off, and with it the
	// protection against replays.
	Remember int
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
	clock  clock
	seen   *seenSet // nil: no memory
	max    int64
	handle func(ctx context.Context, msg outbox.Message) error
	tracer trace.Tracer // nil: tracing off
}

// NewReceiver returns a Receiver that, for each POST:
//
//  1. reads the body, at most opts.MaxBodyBytes (413 beyond, which the
//     relay takes as permanent);
//  2. verifies the content mode (opts.Mode), the Standard Webhooks
//     signature against every secret (any match will do, so secrets rotate
//     by listing old and new), the timestamp against opts.Tolerance and,
//     in binary mode, the signature of the ce- headers
//     (webhook-outbox-signature): 401 otherwise;
//  3. decodes the message with Decode: 401 when the signed webhook-id is
//     not the event's delivery id, 400 when it is not an outbox event;
//  4. answers 204 at once, without calling handle, when it handled this
//     delivery (webhook-id) already (see opts.Remember), and makes a copy
//     that arrives while the first is being handled wait for its outcome;
//  5. calls handle with the request's context (carrying a CONSUMER span
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
// relay sends an aggregate's next event only after this one's 2xx). The
// memory of handled deliveries lives in this process: after a restart, or
// on another instance behind the same URL, a copy of a request reaches
// handle again. To apply each event once, in order, whatever the copies,
// handle it through an inbox (see the package example), which deduplicates
// by event id in the database.
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
	if opts.Remember == 0 {
		opts.Remember = RememberDefault
	}
	if opts.Mode, err = parseMode(string(opts.Mode)); err != nil {
		return nil, fmt.Errorf("outboxwebhook: ReceiverOptions.Mode: %w", err)
	}
	rc := &Receiver{v: verifier{keys: keys, tolerance: opts.Tolerance, mode: opts.Mode}, clock: clock{now: opts.Now},
		max: opts.MaxBodyBytes, handle: handle,
		tracer: tracing.Tracer(opts.TracerProvider)}
	if opts.Remember > 0 {
		rc.seen = newSeenSet(opts.Remember)
	}
	return rc, nil
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
	now := rc.clock.unix() // one reading for the timestamp check and the memory
	sig, err := rc.v.verify(r.Header, body, now)
	if err != nil {
		fail(w, http.StatusUnauthorized, err.Error())
		return
	}
	msg, err := Decode(r.Header, body)
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, ErrIDMismatch) {
			code = http.StatusUnauthorized
		}
		fail(w, code, err.Error())
		return
	}
	if rc.seen != nil {
		expiry := sig.ts + int64(rc.v.tolerance/time.Second)
		handled, err := rc.seen.begin(r.Context(), sig.id, now, expiry)
		switch {
		case errors.Is(err, errForgotten):
			w.Header().Set("Retry-After", "1")
			fail(w, http.StatusServiceUnavailable, err.Error())
			return
		case err != nil:
			fail(w, http.StatusServiceUnavailable, "the request ended while a copy of it was being handled")
			return
		case handled:
			w.WriteHeader(http.StatusNoContent) // handled before: the same answer, no second effect
			return
		}
		ok := false // stays false should handle panic
		defer func() { rc.seen.end(sig.id, ok, expiry) }()
		ok = rc.serve(w, r, &msg)
		return
	}
	rc.serve(w, r, &msg)
}

// serve hands msg to handle and answers; it reports whether handle
// accepted the event.
func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request, msg *outbox.Message) bool {
	ctx, span := rc.startSpan(r.Context(), msg)
	err := rc.handle(ctx, *msg)
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
		return false
	}
	w.WriteHeader(http.StatusNoContent)
	return true
}

// clock reads a wall clock that never goes back, in Unix seconds.
type clock struct {
	now  func() time.Time
	mu   sync.Mutex
	last int64
}

func (c *clock) unix() int64 {
	t := c.now().Unix()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = max(c.last, t)
	return c.last
}

func fail(w http.ResponseWriter, code int, msg string) {
	if len(msg) > errorBodyBytes {
		msg = msg[:errorBodyBytes]
	}
	http.Error(w, msg, code)
}
