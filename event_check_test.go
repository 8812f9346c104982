package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// badEvents are events every write path must refuse with ErrInvalidEvent
// before anything reaches PostgreSQL (issue 8, items 1 and 4). Several of
// them used to be accepted and then abort the caller's transaction, or be
// stored under another aggregate's id.
func badEvents() map[string]outbox.Event {
	ok := func(f func(*outbox.Event)) outbox.Event {
		ev := orderEvent("o-1", "OrderCreated")
		f(&ev)
		return ev
	}
	return map[string]outbox.Event{
		"aggregate id past the limit": ok(func(e *outbox.Event) { e.AggregateID = strings.Repeat("x", outbox.MaxAggregateIDBytes+1) }),
		"aggregate id of 1500 bytes":  ok(func(e *outbox.Event) { e.AggregateID = strings.Repeat("é", 750) }),
		"aggregate type past limit":   ok(func(e *outbox.Event) { e.AggregateType = strings.Repeat("t", outbox.MaxNameBytes+1) }),
		"event type past limit":       ok(func(e *outbox.Event) { e.Type = strings.Repeat("t", outbox.MaxNameBytes+1) }),
		"invalid UTF-8 in id":         ok(func(e *outbox.Event) { e.AggregateID = "o-\xff" }),
		"NUL in id":                   ok(func(e *outbox.Event) { e.AggregateID = "o-\x00" }),
		"NUL in aggregate type":       ok(func(e *outbox.Event) { e.AggregateType = "order\x00" }),
		"newline in event type":       ok(func(e *outbox.Event) { e.Type = "Order\nCreated" }),
		"invalid UTF-8 in type":       ok(func(e *outbox.Event) { e.Type = "\xc3" }),
		`payload with \u0000`:         ok(func(e *outbox.Event) { e.Payload = []byte(`{"a":"x\u0000y"}`) }),
		"payload with lone surrogate": ok(func(e *outbox.Event) { e.Payload = []byte(`{"a":"\ud800"}`) }),
		"payload with lone low surr.": ok(func(e *outbox.Event) { e.Payload = []byte(`["\udc00\ud800"]`) }),
		"payload with invalid UTF-8":  ok(func(e *outbox.Event) { e.Payload = []byte("{\"a\":\"\xff\"}") }),
		"payload not JSON":            ok(func(e *outbox.Event) { e.Payload = []byte(`{"a":`) }),
		"empty JSON payload":          ok(func(e *outbox.Event) { e.Payload = nil }),
		"JSON content type, not JSON": ok(func(e *outbox.Event) { e.ContentType = "application/cloudevents+json"; e.Payload = []byte{0x0a} }),
		"content type malformed":      ok(func(e *outbox.Event) { e.ContentType = "application/" }),
		"content type with NUL":       ok(func(e *outbox.Event) { e.ContentType = "text/plain\x00" }),
		"NUL in header value":         ok(func(e *outbox.Event) { e.Headers = map[string]string{"x-a": "b\x00"} }),
		"newline in header value":     ok(func(e *outbox.Event) { e.Headers = map[string]string{"x-a": "b\r\nx-b: c"} }),
		"header value padded":         ok(func(e *outbox.Event) { e.Headers = map[string]string{"x-a": " b"} }),
		"invalid UTF-8 header value":  ok(func(e *outbox.Event) { e.Headers = map[string]string{"x-a": "\xff"} }),
		"header name with a space":    ok(func(e *outbox.Event) { e.Headers = map[string]string{"x a": "b"} }),
		"header name with a colon":    ok(func(e *outbox.Event) { e.Headers = map[string]string{"x:a": "b"} }),
		"reserved header ce-id":       ok(func(e *outbox.Event) { e.Headers = map[string]string{"CE-ID": "b"} }),
		"reserved header nats-msg-id": ok(func(e *outbox.Event) { e.Headers = map[string]string{"Nats-Msg-Id": "b"} }),
		"empty header name":           ok(func(e *outbox.Event) { e.Headers = map[string]string{"": "b"} }),
		"too many headers": ok(func(e *outbox.Event) {
			e.Headers = map[string]string{}
			for i := 0; i <= outbox.MaxHeaders; i++ {
				e.Headers[fmt.Sprintf("x-%d", i)] = "v"
			}
		}),
	}
}

// writePath is one way to record events: the typed single-event statement or
// the multi-event one, through pgx or database/sql.
type writePath struct {
	name   string
	insert func(ctx context.Context, evs ...outbox.Event) error
	// alive reports whether the transaction can still be used (not aborted).
	alive func(ctx context.Context) error
	done  func(ctx context.Context) error
}

func writePaths(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, db *sql.DB, w *outbox.Writer) []func() writePath {
	ctx := context.Background()
	pgxPath := func() writePath {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return writePath{name: "pgx",
			insert: func(ctx context.Context, evs ...outbox.Event) error {
				_, err := w.InsertTx(ctx, tx, evs...)
				return err
			},
			alive: func(ctx context.Context) error { _, err := tx.Exec(ctx, "SELECT 1"); return err },
			done:  tx.Commit}
	}
	sqlPath := func() writePath {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return writePath{name: "database/sql",
			insert: func(ctx context.Context, evs ...outbox.Event) error {
				_, err := w.InsertSQLTx(ctx, tx, evs...)
				return err
			},
			alive: func(ctx context.Context) error { _, err := tx.ExecContext(ctx, "SELECT 1"); return err },
			done:  func(context.Context) error { return tx.Commit() }}
	}
	return []func() writePath{pgxPath, sqlPath}
}

// TestInvalidEventsAreRefusedOnEveryPath: each bad event is refused with
// ErrInvalidEvent on the single-event and the multi-event statement, through
// pgx and database/sql alike; the caller's transaction stays usable, and it
// commits nothing of the call.
func TestInvalidEventsAreRefusedOnEveryPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	w := newWriter(t, schema)
	for name, bad := range badEvents() {
		if err := bad.Validate(); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: Validate = %v, want ErrInvalidEvent", name, err)
		}
		for _, open := range writePaths(t, pool, db, w) {
			for _, multi := range []bool{false, true} {
				p := open()
				evs := []outbox.Event{bad}
				if multi {
					evs = []outbox.Event{orderEvent("o-2", "OrderCreated"), bad}
				}
				err := p.insert(ctx, evs...)
				if !errors.Is(err, outbox.ErrInvalidEvent) {
					t.Errorf("%s via %s (multi %v): %v, want ErrInvalidEvent", name, p.name, multi, err)
				}
				if err := p.alive(ctx); err != nil {
					t.Errorf("%s via %s (multi %v): the caller's transaction was aborted: %v", name, p.name, multi, err)
				}
				if err := p.done(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if n := countEvents(t, pool, schema); n != 0 {
		t.Fatalf("%d events stored from refused calls, want 0", n)
	}
}

// TestDistinctIDsStayDistinct: ids that differ in a few bytes are different
// aggregates on both statements. Two ids that differed only in invalid UTF-8
// used to be merged into one aggregate on the multi-event path (JSON encoding
// turned both into U+FFFD); they are refused now (above), and valid ones that
// look alike after normalisation are kept apart.
func TestDistinctIDsStayDistinct(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	ids := []string{"caf\u00e9", "cafe\u0301", "<a&b>", "a\u2028b", "\U0001F600"}
	var evs []outbox.Event
	for _, id := range ids {
		evs = append(evs, orderEvent(id, "OrderCreated"))
	}
	var recs []outbox.Recorded
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) { recs, err = w.InsertTx(ctx, tx, evs...); return err }); err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		if r.Sequence != 1 {
			t.Errorf("%q: sequence %d, want 1 (a new aggregate)", ids[i], r.Sequence)
		}
		m, err := outbox.ReadMessage(ctx, pool, schema, r.ID)
		if err != nil || m.AggregateID != ids[i] {
			t.Errorf("%q stored as %q (%v)", ids[i], m.AggregateID, err)
		}
	}
}

// TestSchemaRefusesOverlongKeys: a row written by another language past the
// limits is refused by the table's CHECK constraint.
func TestSchemaRefusesOverlongKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	for _, col := range []struct{ typ, id, evType string }{
		{"order", strings.Repeat("x", outbox.MaxAggregateIDBytes+1), "E"},
		{strings.Repeat("x", outbox.MaxNameBytes+1), "o", "E"},
		{"order", "o", strings.Repeat("x", outbox.MaxNameBytes+1)},
	} {
		_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
			VALUES (gen_random_uuid(), $1, $2, 1, $3, '{}')`, col.typ, col.id, col.evType)
		if err == nil || !strings.Contains(err.Error(), "outbox_events_key_length_check") {
			t.Errorf("insert of %d/%d/%d-byte keys: %v, want the key length check to refuse it", len(col.typ), len(col.id), len(col.evType), err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, payload_bytes)
		VALUES (gen_random_uuid(), 'order', 'o', 1, 'E', '{}', '\x7b7d')`); err == nil {
		t.Error("a row with both payload columns set was accepted")
	}
}
