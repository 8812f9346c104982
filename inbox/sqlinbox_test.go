package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// sqlStep is one delivery (or seed) of a scenario, run through the Go inbox
// and through the SQL inbox (inbox_claim, inbox_seed: migration 012).
type sqlStep struct {
	seed        int64 // with isSeed: the seed's last applied sequence
	isSeed      bool
	event       int // events with the same number share their id
	seq         int64
	skippedFrom int64
	// when: "" (OccurredAt set to now), "before" (a day before the
	// consumer's start), "after" (an hour after it), "v7-before" (no
	// OccurredAt, a UUIDv7 id of a day ago), "none" (no OccurredAt, a v4 id).
	when string
	fail bool   // the effect fails: the transaction rolls back
	want string // apply, duplicate, early; for a seed, "" or "ahead"
}

type sqlScenario struct {
	name      string
	firstSeen bool
	grace     time.Duration
	steps     []sqlStep
}

// TestSQLInboxAgreesWithTheGoInbox runs each scenario through inbox.Inbox
// and through the SQL functions a consumer in another language calls, on
// consumers of their own in one schema: every answer must be the expected
// one for both, and the mark rows they leave (mark, start, wait) the same.
func TestSQLInboxAgreesWithTheGoInbox(t *testing.T) {
	t.Parallel()
	scenarios := []sqlScenario{
		{name: "in order, duplicates", steps: []sqlStep{
			{event: 1, seq: 1, want: "apply"}, {event: 1, seq: 1, want: "duplicate"}, {event: 2, seq: 2, want: "apply"},
			{event: 3, seq: 3, want: "apply"}, {event: 2, seq: 2, want: "duplicate"}}},
		{name: "a gap waits, then fills", steps: []sqlStep{
			{event: 1, seq: 1, want: "apply"}, {event: 3, seq: 3, want: "early"}, {event: 4, seq: 4, want: "early"},
			{event: 2, seq: 2, want: "apply"}, {event: 3, seq: 3, want: "apply"}, {event: 4, seq: 4, want: "apply"}}},
		{name: "a lower sequence seen while waiting", steps: []sqlStep{
			{event: 1, seq: 1, want: "apply"}, {event: 4, seq: 4, want: "early"}, {event: 3, seq: 3, want: "early"}}},
		{name: "strict: sequence 1 first", steps: []sqlStep{
			{event: 5, seq: 5, when: "before", want: "early"}, {event: 1, seq: 1, want: "apply"}}},
		{name: "operator skipped the gap", steps: []sqlStep{
			{event: 1, seq: 1, want: "apply"}, {event: 3, seq: 3, skippedFrom: 2, want: "apply"}, {event: 4, seq: 4, want: "apply"}}},
		{name: "a skip that does not reach the mark", steps: []sqlStep{
			{event: 1, seq: 1, want: "apply"}, {event: 4, seq: 4, skippedFrom: 3, want: "early"}}},
		{name: "first seen, before the start", firstSeen: true, steps: []sqlStep{
			{event: 5, seq: 5, when: "before", want: "apply"}, {event: 3, seq: 3, when: "before", want: "duplicate"},
			{event: 6, seq: 6, when: "before", want: "apply"}, {event: 8, seq: 8, when: "before", want: "early"}}},
		{name: "first seen, after the start", firstSeen: true, steps: []sqlStep{
			{event: 5, seq: 5, when: "after", want: "early"}, {event: 1, seq: 1, when: "after", want: "apply"},
			{event: 2, seq: 2, when: "after", want: "apply"}}},
		{name: "first seen, a UUIDv7's time", firstSeen: true, steps: []sqlStep{
			{event: 4, seq: 4, when: "v7-before", want: "apply"}}},
		{name: "first seen, no time at all", firstSeen: true, steps: []sqlStep{
			{event: 4, seq: 4, when: "none", want: "apply"}}},
		{name: "first seen, started after the grace", firstSeen: true, grace: time.Microsecond, steps: []sqlStep{
			{event: 5, seq: 5, when: "after", want: "early"}, {event: 6, seq: 6, when: "after", want: "early"},
			{event: 5, seq: 5, when: "after", want: "apply"}, {event: 6, seq: 6, when: "after", want: "apply"}}},
		{name: "first seen, a skip from 1 is no start", firstSeen: true, steps: []sqlStep{
			{event: 5, seq: 5, skippedFrom: 1, when: "before", want: "apply"}}},
		{name: "seeds", steps: []sqlStep{
			{isSeed: true, seed: 4}, {event: 3, seq: 3, want: "duplicate"}, {event: 5, seq: 5, want: "apply"},
			{isSeed: true, seed: 2, want: "ahead"}, {isSeed: true, seed: 5}, {event: 7, seq: 7, want: "early"},
			{isSeed: true, seed: 6}, {event: 7, seq: 7, want: "apply"}}},
		{name: "a seed at 0 is strict under first seen", firstSeen: true, steps: []sqlStep{
			{isSeed: true, seed: 0}, {event: 5, seq: 5, when: "before", want: "early"}, {event: 1, seq: 1, want: "apply"}}},
		{name: "a failed effect leaves nothing", steps: []sqlStep{
			{event: 1, seq: 1, fail: true}, {event: 1, seq: 1, want: "apply"}, {event: 2, seq: 2, fail: true},
			{event: 2, seq: 2, want: "apply"}}},
		{name: "one id, two sequences", steps: []sqlStep{
			{event: 1, seq: 1, want: "apply"}, {event: 1, seq: 2, want: "duplicate"}, {event: 2, seq: 2, want: "apply"}}},
	}
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	claimSQL := `SELECT ` + schema + `.inbox_claim($1, $2, $3, $4, $5, skipped_from => $6, occurred_at => $7,
		start_at_first_seen => $8, start_grace => $9::bigint * interval '1 microsecond')`
	seedSQL := `SELECT ` + schema + `.inbox_seed($1, $2, $3, $4, $5)`
	for i, sc := range scenarios {
		goName, sqlName := fmt.Sprintf("go-%d", i), fmt.Sprintf("sql-%d", i)
		in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: goName, StartAtFirstSeen: sc.firstSeen, StartGrace: sc.grace})
		if err != nil {
			t.Fatal(err)
		}
		grace := sc.grace
		if grace == 0 {
			grace = inbox.StartGraceDefault
		}
		ids := map[int]uuid.UUID{}
		for j, st := range sc.steps {
			where := fmt.Sprintf("%s, step %d", sc.name, j)
			if st.isSeed {
				goErr := in.Seed(ctx, "order", "o", st.seed, "restored")
				_, sqlErr := pool.Exec(ctx, seedSQL, sqlName, "order", "o", st.seed, "restored")
				var pgErr *pgconn.PgError
				switch st.want {
				case "ahead":
					if !errors.Is(goErr, inbox.ErrMarkAhead) {
						t.Errorf("%s: Go seed: %v, want ErrMarkAhead", where, goErr)
					}
					if !errors.As(sqlErr, &pgErr) || pgErr.Code != "55000" {
						t.Errorf("%s: inbox_seed: %v, want SQLSTATE 55000", where, sqlErr)
					}
				default:
					if goErr != nil || sqlErr != nil {
						t.Errorf("%s: seed: Go %v, SQL %v", where, goErr, sqlErr)
					}
				}
				continue
			}
			m := sqlStepMessage(st, ids)
			failed := errors.New("effect failed")
			got, goErr := in.Handle(ctx, m, func(context.Context, pgx.Tx) error {
				if st.fail {
					return failed
				}
				return nil
			})
			var answer string
			sqlErr := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var occurredAt *time.Time
				if !m.OccurredAt.IsZero() {
					occurredAt = &m.OccurredAt
				}
				if err := tx.QueryRow(ctx, claimSQL, sqlName, m.ID, m.AggregateType, m.AggregateID, m.Sequence,
					m.SkippedFrom, occurredAt, sc.firstSeen, grace.Microseconds()).Scan(&answer); err != nil {
					return err
				}
				if st.fail && answer == "apply" {
					return failed
				}
				return nil
			})
			if st.fail {
				if !errors.Is(goErr, failed) || !errors.Is(sqlErr, failed) {
					t.Errorf("%s: a failing effect: Go %v, SQL %v (answer %q)", where, goErr, sqlErr, answer)
				}
				continue
			}
			if goErr != nil || sqlErr != nil {
				t.Fatalf("%s: Go %v, SQL %v", where, goErr, sqlErr)
			}
			goAnswer := map[inbox.Outcome]string{inbox.Applied: "apply", inbox.Duplicate: "duplicate", inbox.Early: "early"}[got]
			if goAnswer != st.want || answer != st.want {
				t.Errorf("%s (sequence %d): Go %s, SQL %s; want %s", where, st.seq, goAnswer, answer, st.want)
			}
		}
		goMark, sqlMark := sqlMarkRow(t, pool, schema, goName), sqlMarkRow(t, pool, schema, sqlName)
		if goMark != sqlMark {
			t.Errorf("%s: the marks differ:\n  Go:  %s\n  SQL: %s", sc.name, goMark, sqlMark)
		}
	}
}

func sqlStepMessage(st sqlStep, ids map[int]uuid.UUID) outbox.Message {
	id, ok := ids[st.event]
	if !ok {
		id = uuid.New()
		if st.when == "v7-before" {
			id = uuidV7At(time.Now().Add(-24 * time.Hour))
		}
		ids[st.event] = id
	}
	m := outbox.Message{ID: id, AggregateType: "order", AggregateID: "o", Sequence: st.seq, SkippedFrom: st.skippedFrom, Type: "T"}
	switch st.when {
	case "":
		m.OccurredAt = time.Now()
	case "before":
		m.OccurredAt = time.Now().Add(-24 * time.Hour)
	case "after":
		m.OccurredAt = time.Now().Add(time.Hour)
	}
	return m
}

// uuidV7At returns a UUIDv7 whose time is at.
func uuidV7At(at time.Time) uuid.UUID {
	id := uuid.Must(uuid.NewV7())
	ms := uint64(at.UnixMilli())
	for i := 0; i < 6; i++ {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id
}

// sqlMarkRow is what a consumer's mark row of order/o records, times and
// reasons left out (the reasons' wording differs between the two).
func sqlMarkRow(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema, consumer string) string {
	t.Helper()
	var row string
	err := pool.QueryRow(context.Background(), `SELECT concat_ws(' ', 'last', last_sequence, 'start', coalesce(start_kind, '-'),
		coalesce(start_prior_mark::text, '-'), coalesce(start_mark::text, '-'), 'started', started_at IS NOT NULL,
		'waiting', waiting_since IS NOT NULL, coalesce(waiting_for::text, '-'), coalesce(waiting_seen::text, '-'))
		FROM `+schema+`.inbox_aggregates WHERE consumer_name = $1 AND aggregate_type = 'order' AND aggregate_id = 'o'`, consumer).Scan(&row)
	if errors.Is(err, pgx.ErrNoRows) {
		return "no mark"
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(row)
}
