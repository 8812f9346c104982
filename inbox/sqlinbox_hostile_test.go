package inbox_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestSQLInboxNullStartAtFirstSeenIsStrict: a caller whose driver sends
// NULL for start_at_first_seen (an unset option: JavaScript's undefined,
// Python's None) must not get an aggregate's sequence 5 applied before its
// sequences 1 to 4. The function either refuses the NULL (22023, like a
// NULL start_grace) or treats it as false (strict: 'early'), never
// 'apply' with no start recorded.
func TestSQLInboxNullStartAtFirstSeenIsStrict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	var answer string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT `+schema+`.inbox_claim('js', $1, 'order', 'o', 5, start_at_first_seen => NULL)`,
			uuid.New()).Scan(&answer)
	})
	if err == nil && answer == "apply" {
		t.Errorf("inbox_claim of sequence 5 of a new aggregate with start_at_first_seen NULL answered %q (mark now: %s); want 'early' or SQLSTATE 22023",
			answer, sqlMarkRow(t, pool, schema, "js"))
	}
}

// TestSQLInboxSkipAtTheHighestMarkAgreesWithGo: an aggregate seeded at the
// highest sequence there is; a redelivery of an earlier event carrying an
// operator's skip is a duplicate for the Go inbox, and must be one for the
// SQL inbox too, not an error on every redelivery (a poison message).
func TestSQLInboxSkipAtTheHighestMarkAgreesWithGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "go"})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Seed(ctx, "order", "o", math.MaxInt64, "restored"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT `+schema+`.inbox_seed('sql', 'order', 'o', $1, 'restored')`, int64(math.MaxInt64)); err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o", Sequence: 5, SkippedFrom: 3, Type: "T"}
	got, err := in.Handle(ctx, m, func(context.Context, pgx.Tx) error { return errors.New("applied") })
	if err != nil || got != inbox.Duplicate {
		t.Fatalf("Go inbox: %v, %v; want duplicate", got, err)
	}
	var answer string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT `+schema+`.inbox_claim('sql', $1, 'order', 'o', 5, skipped_from => 3)`, m.ID).Scan(&answer)
	})
	if err != nil || answer != "duplicate" {
		t.Errorf("SQL inbox: %q, %v; the Go inbox answered duplicate", answer, err)
	}
}

// TestSQLInboxGraceCountsFromTheFirstDelivery: start_grace is how long an
// aggregate new to the consumer waits for its earlier events after its
// first early delivery (the start reason says so: "no event before #N came
// within start_grace of its first delivery"). A consumer that claims in a
// transaction which has run for a while (a batch, other work first) must
// not have that time counted as waiting: the redelivery right after the
// first early answer is early again, as with the Go inbox, not a start
// that drops the aggregate's sequences 1 to 4 still on their way.
func TestSQLInboxGraceCountsFromTheFirstDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	const grace = 500 * time.Millisecond
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "go", StartAtFirstSeen: true, StartGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	claim := `SELECT ` + schema + `.inbox_claim($1, $2, 'order', 'o', 5, occurred_at => $3, start_at_first_seen => true,
		start_grace => $4::bigint * interval '1 microsecond')`
	// Both consumers' start points first, so that the event occurs after them.
	if _, err := in.StartPoint(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT `+schema+`.inbox_start_point('sql')`); err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o", Sequence: 5, Type: "T", OccurredAt: time.Now().Add(time.Hour)}
	noEffect := func(context.Context, pgx.Tx) error { return nil }
	for i, want := range []inbox.Outcome{inbox.Early, inbox.Early} {
		if got, err := in.Handle(ctx, m, noEffect); err != nil || got != want {
			t.Fatalf("Go inbox, delivery %d: %v, %v; want %v", i+1, got, err, want)
		}
	}
	// The first delivery, claimed in a transaction that did other work for
	// longer than the grace before.
	var answers [2]string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_sleep($1::float8)`, (grace + 100*time.Millisecond).Seconds()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, claim, "sql", m.ID, m.OccurredAt, grace.Microseconds()).Scan(&answers[0])
	})
	if err != nil {
		t.Fatal(err)
	}
	// Its redelivery, at once.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, claim, "sql", m.ID, m.OccurredAt, grace.Microseconds()).Scan(&answers[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	if answers != [2]string{"early", "early"} {
		t.Errorf("SQL inbox: %v for a delivery and its immediate redelivery (grace %v); the Go inbox answered early, early (mark now: %s)",
			answers, grace, sqlMarkRow(t, pool, schema, "sql"))
	}
}
