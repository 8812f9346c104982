package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdvEnqueueNilIDIsAssigned: the Go writer reads a zero Event.ID as
// "assign a UUIDv7"; enqueue stores the nil UUID as the event's id. A
// service whose driver or ORM sends a zero UUID for "no id" then gives all
// its events one shared id: the second write fails with 23505 while the
// first is in the outbox, and once clean-up deleted the first, the next one
// is a 'duplicate' in every consumer's processed_events, is never applied,
// and leaves its aggregate's later events 'early' for ever.
func TestAdvEnqueueNilIDIsAssigned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	var id uuid.UUID
	err := pool.QueryRow(ctx, `SELECT event_id FROM `+schema+`.enqueue('order', 'o-nil', 'Placed', '{}'::text,
		id => '00000000-0000-0000-0000-000000000000')`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	if id == uuid.Nil || id.Version() != 7 {
		t.Fatalf("enqueue(id => nil UUID) stored event id %s; want a UUIDv7 assigned, as Writer does for a zero Event.ID", id)
	}
	var manyID uuid.UUID
	err = pool.QueryRow(ctx, `SELECT event_id FROM `+schema+`.enqueue_many('[{"aggregate_type":"order","aggregate_id":"o-nil2",
		"event_type":"Placed","payload":{},"event_id":"00000000-0000-0000-0000-000000000000"}]')`).Scan(&manyID)
	if err != nil {
		t.Fatal(err)
	}
	if manyID == uuid.Nil {
		t.Fatalf("enqueue_many(event_id nil UUID) stored event id %s; want one assigned", manyID)
	}
}

// TestAdvEnqueueTraceparentDoesNotHideBadHeaders: headers that are not a
// JSON object are refused (22023, COLUMN headers), but with a traceparent
// argument with_traceparent replaces them by {"traceparent": ...} before
// enqueue_check sees them: the call succeeds and the caller's headers are
// silently dropped.
func TestAdvEnqueueTraceparentDoesNotHideBadHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, headers := range []string{`["x-tenant", "t1"]`, `"x-tenant: t1"`, `42`} {
		for name, form := range map[string]string{
			"enqueue": `SELECT * FROM ` + schema + `.enqueue('order', 'o-h', 'Placed', '{}'::text, headers => $1::jsonb, traceparent => $2)`,
			"enqueue_many": `SELECT * FROM ` + schema + `.enqueue_many(jsonb_build_array(jsonb_build_object('aggregate_type', 'order', 'aggregate_id', 'o-h',
				'event_type', 'Placed', 'payload', '{}'::jsonb, 'headers', $1::jsonb, 'traceparent', $2::text)))`,
		} {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, form, headers, tp)
				if err == nil {
					return errors.New("accepted")
				}
				return err
			})
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22023" || pgErr.ColumnName != "headers" {
				t.Errorf("%s: headers %s with a traceparent: %v; want SQLSTATE 22023, COLUMN headers (as without a traceparent)", name, headers, err)
			}
		}
	}
}

// TestAdvEnqueueRefusesAnInvalidTraceparent: W3C Trace Context forbids
// version ff and an all-zero trace id or parent id ("invalid"); the doc says
// a traceparent that is not W3C's is refused, but the pattern checks the
// shape only, so enqueue stores an invalid trace context that every
// consumer's propagator discards.
func TestAdvEnqueueRefusesAnInvalidTraceparent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, tp := range []string{
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT * FROM `+schema+`.enqueue('order', 'o-t', 'Placed', '{}'::text, traceparent => $1)`, tp)
			if err == nil {
				return errors.New("accepted")
			}
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || pgErr.ColumnName != "traceparent" {
			t.Errorf("traceparent %s: %v; want SQLSTATE 22023, COLUMN traceparent", tp, err)
		}
	}
}

// TestAdvEnqueueManyDocumentedSQLSTATEs: docs/sql-api.md says an event that
// breaks a rule is refused with 22023 and a COLUMN naming the argument;
// enqueue_many casts schema_version and event_id without a check, so a
// Python or Node writer's malformed value gets PostgreSQL's cast error
// (22P02, 22003) with no COLUMN and no "invalid event N" index.
func TestAdvEnqueueManyDocumentedSQLSTATEs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, ev := range []string{
		`{"aggregate_type":"order","aggregate_id":"o-s","event_type":"Placed","payload":{},"schema_version":"two"}`,
		`{"aggregate_type":"order","aggregate_id":"o-s","event_type":"Placed","payload":{},"schema_version":1.5}`,
		`{"aggregate_type":"order","aggregate_id":"o-s","event_type":"Placed","payload":{},"schema_version":3000000000}`,
		`{"aggregate_type":"order","aggregate_id":"o-s","event_type":"Placed","payload":{},"event_id":"not-a-uuid"}`,
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT * FROM `+schema+`.enqueue_many(jsonb_build_array($1::jsonb))`, ev)
			if err == nil {
				return errors.New("accepted")
			}
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || pgErr.ColumnName == "" {
			t.Errorf("%s: %v; want SQLSTATE 22023 with COLUMN (docs/sql-api.md, Errors)", ev, err)
		}
	}
}
