package outbox_test

// Second adversarial review of the SQL write API after migration 013. Each
// test below fails on the code it was written against and names the defect
// it shows; docs/sql-api.md is the contract.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/tracing"
)

// adv2Call runs query in a transaction that is always rolled back and
// returns its error.
func adv2Call(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, query string, args ...any) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// adv2Documented reports whether err is the documented refusal: SQLSTATE
// 22023, message "invalid event N: …", COLUMN naming the argument.
func adv2Documented(err error, column string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22023" && pgErr.ColumnName == column &&
		strings.HasPrefix(pgErr.Message, "invalid event 0: ")
}

// TestAdv2EnqueueManyEventIDBraces: many_event_id's pattern makes each
// brace optional on its own ('^\{?…\}?$'), while PostgreSQL's uuid input
// wants both or neither. An event_id with one brace passes the check and
// fails the cast: 22P02 with no COLUMN and no "invalid event N", the very
// undocumented error 013 meant to end. Fix: '^(\{[…]\}|[…])$', or catch
// invalid_text_representation around the cast and raise 22023.
func TestAdv2EnqueueManyEventIDBraces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, id := range []string{"{0189d6f6-7f2a-7000-8000-000000000001", "0189d6f6-7f2a-7000-8000-000000000001}"} {
		err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue_many(jsonb_build_array(jsonb_build_object(
			'aggregate_type', 'order', 'aggregate_id', 'o-b', 'event_type', 'Placed', 'payload', '{}'::jsonb, 'event_id', $1::text)))`, id)
		if !adv2Documented(err, "event_id") {
			t.Errorf("event_id %q: %v; want SQLSTATE 22023, COLUMN event_id, \"invalid event 0: …\"", id, err)
		}
	}
}

// TestAdv2EnqueueManyEventIDSpellingsAsEnqueue: enqueue's id is a uuid
// argument, so it takes every spelling PostgreSQL's uuid input takes; among
// them a hyphen after any group of four hex digits. many_event_id's
// pattern allows hyphens only where the canonical form has them, so the
// same id a Python or Node writer passes to enqueue is refused by
// enqueue_many. Fix: let the cast decide (catch its 22P02 and raise 22023),
// or match '^\{?[0-9a-f]{4}(-?[0-9a-f]{4}){7}\}?$' with balanced braces.
func TestAdv2EnqueueManyEventIDSpellingsAsEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	const id = "0189-d6f6-7f2a-7000-8000-0000-0000-0001"
	if err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue('order', 'o-s', 'Placed', '{}'::text, id => $1::text::uuid)`, id); err != nil {
		t.Fatalf("enqueue(id => %q): %v", id, err)
	}
	err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue_many(jsonb_build_array(jsonb_build_object(
		'aggregate_type', 'order', 'aggregate_id', 'o-s', 'event_type', 'Placed', 'payload', '{}'::jsonb, 'event_id', $1::text)))`, id)
	if err != nil {
		t.Errorf("enqueue accepts id %q; enqueue_many refuses it as event_id: %v", id, err)
	}
}

// TestAdv2EnqueueManyBadBase64: a payload_base64 that is not base64 (or not
// a string) reaches decode() unchecked: PostgreSQL's own 22023 "invalid
// symbol … while decoding base64" with no COLUMN and no event index, where
// the doc promises "invalid event N: …" and COLUMN for every refused event.
// A writer cannot tell which event or field was wrong. Fix: check
// jsonb_typeof = 'string' and catch invalid_parameter_value around decode,
// raising 22023 COLUMN payload_base64 (or payload), "invalid event N:
// payload_base64 is not base64".
func TestAdv2EnqueueManyBadBase64(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, p := range []string{`"!!!"`, `"abc"`, `123`, `{"a":1}`} {
		err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue_many(jsonb_build_array(jsonb_build_object(
			'aggregate_type', 'order', 'aggregate_id', 'o-p', 'event_type', 'Placed', 'payload_base64', $1::jsonb)))`, p)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.HasPrefix(pgErr.Message, "invalid event 0: ") ||
			!strings.HasPrefix(pgErr.ColumnName, "payload") {
			t.Errorf("payload_base64 %s: %v (column %q); want 22023, \"invalid event 0: …\", COLUMN payload_base64 or payload",
				p, err, func() string {
					if pgErr != nil {
						return pgErr.ColumnName
					}
					return ""
				}())
		}
	}
}

// TestAdv2EnqueueManySchemaVersionSpellings: many_schema_version tests
// jsonb's text of the number, not the number: jsonb keeps a number's scale,
// so 1e0 and 10e-1 print "1" and "1.0". The same value 1 is accepted in one
// spelling and refused as "not an integer" in the other; a Python writer's
// json.dumps(1.0) is refused, 1e3 is 1000. Fix: decide on the value
// (v::numeric = trunc(v::numeric)), or on the text given; either way one
// rule for every spelling of a number.
func TestAdv2EnqueueManySchemaVersionSpellings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	outcome := map[string]error{}
	for _, v := range []string{`1`, `1e0`, `1.0`, `10e-1`, `1.00`} {
		outcome[v] = adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue_many(jsonb_build_array(jsonb_build_object(
			'aggregate_type', 'order', 'aggregate_id', 'o-v', 'event_type', 'Placed', 'payload', '{}'::jsonb, 'schema_version', $1::jsonb)))`, v)
	}
	for v, err := range outcome {
		if (err == nil) != (outcome["1e0"] == nil) {
			t.Errorf("schema_version 1e0: %v; schema_version %s (the same number): %v; want one decision", outcome["1e0"], v, err)
		}
	}
}

// TestAdv2TraceparentAsConsumersRead: the doc says a traceparent is refused
// when consumers' propagators would drop it. The relay and the Go inbox read
// it with OpenTelemetry's propagation.TraceContext (internal/tracing), which
// drops version 00 with a reserved flag bit set (flags over 03) and accepts
// a later version followed by more fields, as W3C Trace Context requires
// ("if a higher version is detected … parse the first 55 characters").
// with_traceparent's pattern stores the first (consumers lose the trace)
// and refuses the second (aborting the caller's transaction). Fix: for
// version 00 require flags in 00-03 (or as the propagator reads: flags &
// 0xfc = 0) and nothing after; for 01-fe accept '^…-[0-9a-f]{2}(-.*)?$'.
func TestAdv2TraceparentAsConsumersRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	const ids = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	for _, tp := range []string{
		"00-" + ids + "-01",                  // both accept
		"00-" + ids + "-ff",                  // reserved flags: propagator drops
		"00-" + ids + "-04",                  // reserved flag bit: propagator drops
		"01-" + ids + "-01",                  // later version: both accept
		"01-" + ids + "-01-future",           // later version, more fields: W3C and the propagator accept
		"00-" + ids + "-01-future",           // version 00 with more fields: both refuse
		"00-" + strings.ToUpper(ids) + "-01", // upper case: both refuse
	} {
		goAccepts := tracing.FromHeaders(map[string]string{"traceparent": tp}).IsValid()
		err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue('order', 'o-t', 'Placed', '{}'::text, traceparent => $1)`, tp)
		var pgErr *pgconn.PgError
		if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "22023") {
			t.Fatalf("traceparent %s: %v", tp, err)
		}
		if sqlAccepts := err == nil; sqlAccepts != goAccepts {
			t.Errorf("traceparent %s: enqueue accepts it: %v; the consumers' propagator (OpenTelemetry TraceContext) reads it: %v",
				tp, sqlAccepts, goAccepts)
		}
	}
}

// TestAdv2TextEnqueueFollowsTheRaisedPayloadLimit: the payload limit raised
// as docs/sql-api.md says (ALTER FUNCTION on each of the three write
// functions) applies to both forms of enqueue. Found in 013 as first
// written: the text form called enqueue_one with a limit of its own that the
// docs did not name, so a service writing a text payload (most drivers'
// strings, the demo's --writer sql) was still refused over 1 MiB while the
// Go writer and enqueue_many took it.
func TestAdv2TextEnqueueFollowsTheRaisedPayloadLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, fn := range []string{"enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid)",
		"enqueue(text, text, text, text, text, jsonb, text, integer, uuid)", "enqueue_many(jsonb)"} {
		if _, err := pool.Exec(ctx, `ALTER FUNCTION `+schema+`.`+fn+` SET outbox.max_payload_bytes = '4194304'`); err != nil {
			t.Fatal(err)
		}
	}
	payload := `"` + strings.Repeat("x", 2<<20) + `"`
	if err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue('order', 'o-big', 'Placed', $1::bytea)`, []byte(payload)); err != nil {
		t.Fatalf("bytea form after raising the limit to 4 MiB: %v", err)
	}
	if err := adv2Call(ctx, pool, `SELECT * FROM `+schema+`.enqueue('order', 'o-big', 'Placed', $1::text)`, payload); err != nil {
		t.Errorf("the limit raised to 4 MiB as docs/sql-api.md says; the bytea form takes a 2 MiB payload, the text form refuses it: %v", err)
	}
}
