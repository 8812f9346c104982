package chaos

import (
	"context"
	"reflect"
	"testing"

	"github.com/pgoutbox/outbox/internal/rabbittest"
)

// The RabbitMQ consumer crashes after its inbox transaction committed,
// before the ack: the broker requeues the message when the connection
// dies, the restarted consumer gets it again, and its inbox recognises it.
// On an exchange and queues of the test's own on the machine's RabbitMQ.
// The witness queue stays readable: two reads give the same messages in
// the same order.
func TestBoundaryConsumerAfterCommitBeforeAckAMQP(t *testing.T) {
	runBoundary(t, boundary{target: "consumer-1", failpoint: "consumer/after-commit-before-ack", nth: 3, commands: 20, late: true,
		dest: rabbittest.URL(),
		atCrash: func(t *testing.T, e *env, _ *Driver) {
			if n := e.queryInt(`SELECT count(*) FROM {s}.processed_events`); n < 3 {
				t.Fatalf("after the crash: %d inbox rows; want the crashed delivery's committed", n)
			}
		},
		after: func(t *testing.T, e *env, r *Report) {
			if n := e.countLines("consumer-", "duplicate delivery suppressed"); n == 0 {
				t.Fatal("the redelivery was not suppressed as a duplicate")
			}
			again, err := e.dest.Messages(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(again)) != r.StreamMessages || r.StreamMessages < r.Events {
				t.Fatalf("the witness queue read %d messages, then %d (%d events)", r.StreamMessages, len(again), r.Events)
			}
			first, err := e.dest.Messages(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(first, again) {
				t.Fatal("two reads of the witness queue differ")
			}
		}})
}
