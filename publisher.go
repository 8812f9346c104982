package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Message is one outbox event on its way to a destination.
type Message struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	// Sequence is the event's aggregate_sequence.
	Sequence      int64
	Type          string
	SchemaVersion int
	// ContentType is the payload's media type (CloudEvents datacontenttype):
	// the Event's ContentType, or ContentTypeJSON when it had none.
	ContentType string
	// Payload is the payload exactly as the writer was given it.
	Payload    []byte
	Headers    map[string]string
	OccurredAt time.Time
	// Attempt is 1 for the first publish attempt, then counts up.
	Attempt int
	// SkippedFrom is zero unless an operator skipped the events just before
	// this one (see Admin.Skip): then the aggregate's events SkippedFrom
	// through Sequence-1 were settled without being published and never will
	// be, and a consumer takes SkippedFrom-1 as this event's predecessor.
	SkippedFrom int64
	// ReplayID is the zero UUID unless the message is an already-published
	// event sent again by Admin.Replay; then it identifies the replay run.
	// ID stays the event's id, so inboxes drop what they have applied;
	// destinations that deduplicate by event id (JetStream's Nats-Msg-Id)
	// key a replayed copy by ID and ReplayID, so that it is not dropped as a
	// duplicate of the original publish.
	ReplayID uuid.UUID
}

// Publisher sends messages to a destination (a broker, a webhook, ...).
//
// The contract every destination follows:
//
//   - Publish returns only when every message has been acknowledged by the
//     destination, has failed, or ctx has ended. A nil error for a message
//     means the destination has durably accepted it.
//   - It returns nil when all messages succeeded; otherwise a slice with one
//     entry per message (nil for those that succeeded).
//   - Errors are classified, not retried: wrap errors the destination will
//     never accept (message too large, refused by schema) with [Permanent],
//     errors meaning the destination cannot be reached at all with
//     [Unavailable], and a refusal of everything sent on one route (a
//     missing binding, topic or stream, no authorization for it) with
//     [RouteUnavailable]. Anything else is a retryable failure of that
//     message. [RetryAfter] adds the delay the destination asked for.
//     A refusal that does not depend on the message must never be
//     Permanent: the relay would quarantine every event in turn.
//     The relay owns retries, backoff and quarantine.
//   - The relay never passes two messages of the same aggregate in one call,
//     so a destination may send all of them concurrently; unless the
//     Publisher declares ordered pipelining (see [OrderedPipeliner]).
//   - Publish is safe for concurrent use and does not retain msgs.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) []error
}

// Prober is implemented by a Publisher that can tell, cheaply and without
// publishing anything, whether its destination is reachable now.
//
// A relay whose last publishes failed as [Unavailable] stays "not ready"
// (see Relay.Ready) until it learns otherwise. While it has events to
// publish, publishing them tells it; when it has none (another relay
// published them, or the backlog drained), it calls Probe instead, with the
// same backoff, and a nil result ends the outage. Without a Prober such a
// relay stays not ready until it next publishes.
//
// Probe returns nil when the destination can be reached and would accept
// messages, an error marked with [Unavailable] when it cannot be reached,
// and any other error when it answers but cannot be used; the relay treats
// every error as "still unavailable". It must honour ctx and be safe for
// concurrent use with Publish.
type Prober interface {
	Probe(ctx context.Context) error
}

// OrderedPipeliner is implemented by a Publisher whose destination itself
// refuses to append an aggregate's event out of order, so that the relay
// may send event k+1 before k was acknowledged without risking invariant I5
// (Kafka's idempotent producer: sequence numbers per partition, and a
// failed record fails every record buffered behind it).
//
// When OrderedPipelining reports true, the relay passes each aggregate's
// claimed events (a lane: consecutive sequences) in one Publish call, in
// sequence order, and the Publisher promises, for each aggregate in the
// call: its results are successes followed only by failures, and the
// destination never stores one of its messages without every earlier one of
// the call stored before it (a failed message that may have been stored,
// say after a timeout, may be followed by stored successors; one that was
// not stored, never). The relay marks the successes published, records the
// first failure against its event, and releases the events after it
// without spending their attempts; they go out again after it.
//
// A destination that cannot refuse an out-of-order append (RabbitMQ, an HTTP
// endpoint, JetStream, whose expected-last-subject-sequence check needs the
// stream sequence of k before k+1 is sent) must not declare it: the relay
// then publishes in waves, k+1 only after the destination acknowledged k.
type OrderedPipeliner interface {
	Publisher
	OrderedPipelining() bool
}

// PublisherFunc adapts a function to the Publisher interface.
type PublisherFunc func(ctx context.Context, msgs []Message) []error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) []error { return f(ctx, msgs) }

type permanentError struct{ err error }

func (e permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

type unavailableError struct{ err error }

func (e unavailableError) Error() string { return "destination unavailable: " + e.err.Error() }
func (e unavailableError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix: the relay quarantines
// the event at once instead of backing off.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// Unavailable marks err as "the destination cannot be reached" (as opposed to
// "the destination refused this message"). The relay backs off without
// spending the event's attempts, so an outage never quarantines healthy events.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

type routeError struct {
	route string
	err   error
}

func (e routeError) Error() string {
	return fmt.Sprintf("destination unavailable for route %q: %s", e.route, e.err.Error())
}
func (e routeError) Unwrap() error { return e.err }

// RouteUnavailable marks err as "the destination refuses everything sent on
// this route now", as opposed to "the destination refused this message": a
// RabbitMQ routing key no queue is bound for, a Kafka topic that does not
// exist or that the relay may not write to. route names it (a routing key, a
// topic) and should be shared by every message that goes the same way: the
// relay keeps its state per route. The relay spends no attempt and never
// quarantines such an event; it holds the route's events back, probes the
// route with one of them, reports it in Relay.Ready, and releases them all
// as soon as one is published (see docs/design.md, "Outages, routes and
// readiness"). IsUnavailable reports true for such an error.
func RouteUnavailable(route string, err error) error {
	if err == nil {
		return nil
	}
	return routeError{route, err}
}

// UnavailableRoute returns the route err was marked with by
// RouteUnavailable.
func UnavailableRoute(err error) (string, bool) {
	var e routeError
	if errors.As(err, &e) {
		return e.route, true
	}
	return "", false
}

// RetryAfterMax bounds the delay a destination may ask for with RetryAfter.
const RetryAfterMax = time.Hour

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e retryAfterError) Error() string { return e.err.Error() }
func (e retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err with the delay the destination asked for before the
// message is tried again (an HTTP Retry-After header, a broker's throttling
// hint). The relay then waits at least that long, at most RetryAfterMax,
// before the event's next attempt, whatever else err is marked with: it
// combines with Unavailable, and is irrelevant to Permanent.
func RetryAfter(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	return retryAfterError{err, delay}
}

// RetryDelay returns the delay err was marked with by RetryAfter.
func RetryDelay(err error) (time.Duration, bool) {
	var e retryAfterError
	if errors.As(err, &e) {
		return e.delay, true
	}
	return 0, false
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return errors.As(err, new(permanentError)) }

// IsUnavailable reports whether err was marked with Unavailable or
// RouteUnavailable.
func IsUnavailable(err error) bool {
	return errors.As(err, new(unavailableError)) || errors.As(err, new(routeError))
}

// SequenceHeader formats an aggregate sequence the way destinations carry it:
// zero-padded to 20 digits, so that it sorts as text.
func SequenceHeader(seq int64) string { return fmt.Sprintf("%020d", seq) }
