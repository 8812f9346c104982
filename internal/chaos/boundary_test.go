package chaos

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// boundary is one crash test: the member that runs with a crash failpoint,
// and what must be true at the crash and after the recovery.
type boundary struct {
	target    string // member name: "api", "relay-1", "consumer-1"
	failpoint string // the boundary's name; the rule is "<failpoint>=crash@<nth>"
	nth       int
	commands  int
	// late starts the target only once the commands are done, so a relay
	// or consumer finds a backlog on its first batch.
	late bool
	// dest is the destination (envOptions.dest; default the machine's NATS).
	dest string
	// atCrash checks the state the crash left, before the restart.
	atCrash func(t *testing.T, e *env, d *Driver)
	// after checks the boundary's own evidence after the recovery.
	after func(t *testing.T, e *env, r *Report)
}

// runBoundary runs the order API, a relay and an inventory consumer as
// processes; the target runs with the crash failpoint, dies of SIGKILL
// there, and is restarted without it. Then every invariant must hold on the
// final state of PostgreSQL and the stream.
func runBoundary(t *testing.T, b boundary) {
	t.Parallel()
	e := newEnv(t, envOptions{dest: b.dest})
	spec := b.failpoint + "=crash@" + strconv.Itoa(b.nth)
	if b.late {
		e.startAll(nil, b.target)
	} else {
		e.startAll(map[string]string{b.target: spec})
	}
	d := e.driver()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		d.Run(ctx, 1, 0, b.commands)
	}()
	if b.late {
		<-driven
		e.start(b.target, spec)
	}
	e.expectCrash(b.target, 1, b.failpoint)
	if b.atCrash != nil {
		b.atCrash(t, e, d)
	}
	e.start(b.target, "")
	<-driven
	r := e.converge(d)
	if b.after != nil {
		b.after(t, e, r)
	}
}

// The order API crashes just before a command's COMMIT: that command left
// nothing, and its retry with the same Idempotency-Key creates it once.
func TestBoundaryOrderBeforeCommit(t *testing.T) {
	runBoundary(t, boundary{target: "api", failpoint: "order/before-commit", nth: 4, commands: 25,
		atCrash: func(t *testing.T, e *env, d *Driver) {
			// The driver is blocked on the crashed command: every event in the
			// table belongs to a command the client saw commit.
			if n, want := e.queryInt(`SELECT count(*) FROM {s}.outbox_events`), int64(d.Ledger.Committed()); n != want {
				t.Fatalf("after the crash before COMMIT: %d events, %d commands committed", n, want)
			}
		},
		after: func(t *testing.T, e *env, r *Report) {
			if r.Ambiguous == 0 {
				t.Fatal("no command saw the crash")
			}
		}})
}

// The order API crashes after the COMMIT, before answering: the command is
// committed although the client got no answer; the retry with the same
// Idempotency-Key gets the same order (a replay), not a second one.
func TestBoundaryOrderAfterCommitBeforeResponse(t *testing.T) {
	runBoundary(t, boundary{target: "api", failpoint: "order/after-commit-before-response", nth: 4, commands: 25,
		atCrash: func(t *testing.T, e *env, d *Driver) {
			if n, want := e.queryInt(`SELECT count(*) FROM {s}.outbox_events`), int64(d.Ledger.Committed()+1); n != want {
				t.Fatalf("after the crash after COMMIT: %d events, want %d (the unanswered command's too)", n, want)
			}
		},
		after: func(t *testing.T, e *env, r *Report) {
			if r.Ambiguous == 0 || r.Replays == 0 {
				t.Fatalf("%d ambiguous commands, %d replays: the unanswered command was not retried", r.Ambiguous, r.Replays)
			}
		}})
}

// The relay crashes inside its claim transaction, before COMMIT: the claim
// rolls back with the connection, no lease is left, and the restarted relay
// publishes everything.
func TestBoundaryRelayDuringClaim(t *testing.T) {
	runBoundary(t, boundary{target: "relay-1", failpoint: "relay/during-claim", nth: 1, commands: 20, late: true,
		atCrash: func(t *testing.T, e *env, d *Driver) {
			// The claim's transaction dies with its connection: no lease is
			// ever visible, and nothing is published.
			outboxtest.Eventually(t, 30*time.Second, "the crashed claim's backend gone", func() bool {
				return e.queryInt(`SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{s}%claim_token%' AND state LIKE 'idle in transaction%'`) == 0
			})
			leased := e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE claim_token IS NOT NULL`)
			published := e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE published_at IS NOT NULL`)
			if leased != 0 || published != 0 || e.streamCount() != 0 {
				t.Fatalf("after a crash inside the claim: %d leased, %d published, %d in the stream; want none", leased, published, e.streamCount())
			}
		}})
}

// leasedNotPublished: the crashed relay's claim committed, nothing reached
// the broker or was marked.
func leasedNotPublished(t *testing.T, e *env, _ *Driver) {
	leased := e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE claim_token IS NOT NULL`)
	published := e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE published_at IS NOT NULL`)
	if leased == 0 || published != 0 || e.streamCount() != 0 {
		t.Fatalf("after the crash: %d leased, %d published, %d in the stream; want leases only", leased, published, e.streamCount())
	}
}

// The relay crashes after its claim committed: the events stay leased until
// the lease expires, then the restarted relay takes them over.
func TestBoundaryRelayAfterClaim(t *testing.T) {
	runBoundary(t, boundary{target: "relay-1", failpoint: "relay/after-claim", nth: 1, commands: 20, late: true,
		atCrash: leasedNotPublished})
}

// The relay crashes just before publishing: as after the claim.
func TestBoundaryRelayBeforePublish(t *testing.T) {
	runBoundary(t, boundary{target: "relay-1", failpoint: "relay/before-publish", nth: 1, commands: 20, late: true,
		atCrash: leasedNotPublished})
}

// The relay crashes after the broker acknowledged, before published_at: the
// restarted relay publishes the events again (the stream holds them twice,
// its deduplication window being short) and the consumer's inbox applies
// each once.
func TestBoundaryRelayAfterAckBeforeMark(t *testing.T) {
	runBoundary(t, boundary{target: "relay-1", failpoint: "relay/after-ack-before-mark", nth: 1, commands: 20, late: true,
		atCrash: func(t *testing.T, e *env, _ *Driver) {
			leased := e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE claim_token IS NOT NULL`)
			published := e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE published_at IS NOT NULL`)
			// The first wave (one event per aggregate's lane) was acknowledged.
			if n := e.streamCount(); leased == 0 || published != 0 || n == 0 || n > leased {
				t.Fatalf("after the crash: %d leased, %d published, %d in the stream; want the first wave acked, none marked", leased, published, n)
			}
		},
		after: func(t *testing.T, e *env, r *Report) {
			if r.DuplicatesPublished == 0 {
				t.Fatal("no event reached the stream twice")
			}
			if n := e.countLines("consumer-", "duplicate delivery suppressed"); n == 0 {
				t.Fatal("the consumer suppressed no duplicate")
			}
		}})
}

// The consumer crashes after its inbox transaction committed, before the
// ack: the event is redelivered to the restarted consumer, whose inbox
// recognises it and changes nothing.
func TestBoundaryConsumerAfterCommitBeforeAck(t *testing.T) {
	runBoundary(t, boundary{target: "consumer-1", failpoint: "consumer/after-commit-before-ack", nth: 3, commands: 20, late: true,
		atCrash: func(t *testing.T, e *env, _ *Driver) {
			if n := e.queryInt(`SELECT count(*) FROM {s}.processed_events`); n < 3 {
				t.Fatalf("after the crash: %d inbox rows; want the crashed delivery's committed", n)
			}
		},
		after: func(t *testing.T, e *env, r *Report) {
			if n := e.countLines("consumer-", "duplicate delivery suppressed"); n == 0 {
				t.Fatal("the redelivery was not suppressed as a duplicate")
			}
		}})
}

// The Kafka consumer crashes after its inbox transaction committed, before
// committing the offset: the restarted consumer gets the record again from
// the group's committed offset, and its inbox recognises it. On franz-go's
// in-process Kafka-protocol cluster (kfake), which this test process runs.
func TestBoundaryConsumerAfterCommitBeforeOffsetCommitKafka(t *testing.T) {
	runBoundary(t, boundary{target: "consumer-1", failpoint: "consumer/after-commit-before-ack", nth: 3, commands: 20, late: true, dest: "kafka",
		atCrash: func(t *testing.T, e *env, _ *Driver) {
			if n := e.queryInt(`SELECT count(*) FROM {s}.processed_events`); n < 3 {
				t.Fatalf("after the crash: %d inbox rows; want the crashed delivery's committed", n)
			}
		},
		after: func(t *testing.T, e *env, r *Report) {
			if n := e.countLines("consumer-", "duplicate delivery suppressed"); n == 0 {
				t.Fatal("the redelivery was not suppressed as a duplicate")
			}
		}})
}

// TestBoundaryCleanupMidBatch crashes "outbox cleanup" between a batch's
// DELETE and its COMMIT: the batches before it stay deleted, that batch
// rolls back whole, no unpublished event is touched, and a clean run then
// finishes the job. Afterwards the system goes on: the backlog is
// published, cancellations of cleaned-up orders get the next sequence (never
// a reused one) and are applied once.
func TestBoundaryCleanupMidBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.startAll(nil)
	d := e.driver()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d.Run(ctx, 1, 0, 30)
	e.converge(d)                // every invariant, before the clean-up deletes the evidence
	cleaned := map[string]bool{} // the orders whose events the clean-up deletes
	for _, id := range d.Ledger.Open() {
		cleaned[id] = true
	}

	// A backlog the clean-up must not touch.
	if err := e.sys.Stop("relay-1", 15*time.Second); err != nil {
		t.Fatal(err)
	}
	d.Run(ctx, 1, 0, 5)
	count := func(where string) int64 { return e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE ` + where) }
	published, backlog := count("published_at IS NOT NULL"), count("published_at IS NULL")
	inboxRows := e.queryInt(`SELECT count(*) FROM {s}.processed_events`)
	if backlog == 0 || published <= 10 {
		t.Fatalf("%d published and %d unpublished events before the clean-up", published, backlog)
	}
	cleanup := func(failpoints string) *Process {
		t.Helper()
		p, err := StartProcess(ProcessSpec{Name: "cleanup", Path: e.sys.Config().Bins.Outbox,
			Args: []string{"cleanup", "--database-url", e.sys.Config().DatabaseURL, "--schema", e.where.Schema,
				"--older-than", "1ms", "--inbox-older-than", "1ms", "--batch-size", "5"},
			Env: environ(failpoints, 1)}, logSink(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatal("outbox cleanup did not end")
		}
		return p
	}
	p := cleanup("cleanup/mid-batch=crash@2")
	if p.Signaled() != syscall.SIGKILL || p.CountLines("failpoint cleanup/mid-batch: crash") != 1 {
		t.Fatalf("outbox cleanup ended with %v, want SIGKILL at cleanup/mid-batch", p.Err())
	}
	if got := count("published_at IS NOT NULL"); got != published-5 {
		t.Fatalf("after the crash in the second batch: %d published events left of %d; want the first batch (5) deleted, the second rolled back", got, published)
	}
	if got, rows := count("published_at IS NULL"), e.queryInt(`SELECT count(*) FROM {s}.processed_events`); got != backlog || rows != inboxRows {
		t.Fatalf("after the crash: %d unpublished (was %d), %d inbox rows (was %d)", got, backlog, rows, inboxRows)
	}
	if p = cleanup(""); p.Err() != nil {
		t.Fatalf("outbox cleanup without the failpoint: %v", p.Err())
	}
	if got, left := count("published_at IS NULL"), count("published_at IS NOT NULL"); got != backlog || left != 0 {
		t.Fatalf("after the clean-up: %d unpublished (was %d), %d published left", got, backlog, left)
	}

	// Cancel orders whose OrderCreated the clean-up deleted: their events
	// get sequence 2, after the one the counter row remembers.
	var old []string
	for _, id := range d.Ledger.Open() {
		if cleaned[id] && len(old) < 3 {
			old = append(old, id)
		}
	}
	e.start("relay-1", "")
	for _, id := range old {
		d.Do(ctx, &Command{Kind: Cancel, OrderID: id})
	}
	d.Run(ctx, 1, 0, 20)
	if _, err := WaitConverged(ctx, e.pool, e.dest, e.where); err != nil {
		t.Fatal(err)
	}
	if n := count("event_type = 'OrderCancelled' AND aggregate_sequence = 2 AND aggregate_id = ANY('{" + strings.Join(old, ",") + "}')"); n != int64(len(old)) {
		t.Fatalf("%d of the %d cleaned-up orders cancelled afterwards have an OrderCancelled with sequence 2", n, len(old))
	}
	if err := d.Ledger.Resolve(ctx, e.pool, e.where.Schema); err != nil {
		t.Fatal(err)
	}
	r, err := CheckAfterCleanup(ctx, e.pool, e.where, d.Ledger)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Err(); err != nil {
		t.Fatalf("after the clean-up: %v", err)
	}
}
