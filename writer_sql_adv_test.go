package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// advAgreementCases are events on which Event.Validate (what the Go writer
// checks before it sends anything) and the SQL write API that InsertTx runs
// disagree today: Validate accepts them, so InsertTx sends them, and the
// database refuses them, aborting the caller's business transaction with an
// error that is not ErrInvalidEvent.
func advAgreementCases() map[string]outbox.Event {
	ev := func(mod func(*outbox.Event)) outbox.Event {
		e := outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Placed", Payload: []byte(`{"a":1}`)}
		mod(&e)
		return e
	}
	return map[string]outbox.Event{
		// Go's mime package takes { and } as token characters (only RFC
		// 2045's tspecials are excluded); content_type_problem's token class
		// leaves them out.
		"content type subtype with braces": ev(func(e *outbox.Event) { e.ContentType = "application/x{v1}"; e.Payload = []byte("x") }),
		"content type param with braces":   ev(func(e *outbox.Event) { e.ContentType = "text/plain; v={1}"; e.Payload = []byte("x") }),
		// The schema_version column is integer; Validate bounds it below only.
		"schema version over int32": ev(func(e *outbox.Event) { e.SchemaVersion = 1 << 31 }),
	}
}

// TestAdvWriterAcceptsWhatValidateAccepts: an event Validate accepts is
// written by InsertTx (the Go writer goes through enqueue); an event the
// database refuses must be refused by Validate first, as ErrInvalidEvent,
// without aborting the caller's transaction.
func TestAdvWriterAcceptsWhatValidateAccepts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for name, ev := range advAgreementCases() {
		t.Run(name, func(t *testing.T) {
			verr := ev.Validate()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			_, ierr := w.InsertTx(ctx, tx, ev)
			switch {
			case verr == nil && ierr != nil:
				t.Fatalf("Validate accepts %+v; InsertTx (enqueue) refuses it with a database error (not ErrInvalidEvent: %v): %v",
					ev.ContentType, errors.Is(ierr, outbox.ErrInvalidEvent), ierr)
			case verr != nil && ierr == nil:
				t.Fatalf("Validate refuses (%v); InsertTx wrote it", verr)
			}
		})
	}
}
