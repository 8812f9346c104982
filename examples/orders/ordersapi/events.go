package ordersapi

// How the service records an event in a command's transaction: with the Go
// outbox.Writer (the default), or with a plain SQL call of the SQL write
// API (docs/sql-api.md), as a service written in another language would.
// Both go through the same function in the database, so the rows, the
// relay and the consumers are the same either way; "outbox demo --writer
// sql" runs the order system the second way.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/tracing"
)

// The values of Config.Writer.
const (
	// WriterGo records events with outbox.Writer.InsertTx.
	WriterGo = "go"
	// WriterSQL records events by calling the outbox schema's enqueue
	// function in plain SQL, without outbox.Writer.
	WriterSQL = "sql"
)

// eventWriter records one event in tx, the command's transaction.
type eventWriter interface {
	record(ctx context.Context, tx pgx.Tx, ev outbox.Event) error
}

// newEventWriter returns the eventWriter of kind (WriterGo when empty), and
// the outbox.Writer behind it (nil for WriterSQL).
func newEventWriter(kind, schema string) (eventWriter, *outbox.Writer, error) {
	switch kind {
	case "", WriterGo:
		w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
		if err != nil {
			return nil, nil, err
		}
		return goWriter{w}, w, nil
	case WriterSQL:
		s, err := pgident.NewSchema(schema)
		if err != nil {
			return nil, nil, err
		}
		return newSQLWriter(s), nil, nil
	}
	return nil, nil, fmt.Errorf("ordersapi: writer %q: want %s or %s", kind, WriterGo, WriterSQL)
}

// goWriter is WriterGo.
type goWriter struct{ w *outbox.Writer }

func (g goWriter) record(ctx context.Context, tx pgx.Tx, ev outbox.Event) error {
	_, err := g.w.InsertTx(ctx, tx, ev)
	return err
}

// sqlWriter is WriterSQL: the statement any PostgreSQL client can send. The
// payload goes as text (the JSON document), which picks the text form of
// enqueue; the request's trace context goes as the traceparent argument
// (and a tracestate header), as a service's tracing library would give it.
type sqlWriter struct{ query string }

func newSQLWriter(s pgident.Schema) sqlWriter {
	return sqlWriter{query: `SELECT event_id FROM ` + s.Quoted() + `.enqueue($1, $2, $3, $4::text,
	headers => $5::jsonb, traceparent => $6)`}
}

func (w sqlWriter) record(ctx context.Context, tx pgx.Tx, ev outbox.Event) error {
	var headers, traceparent any // NULL unless the request is traced
	if tp, ts, ok := tracing.Encode(trace.SpanContextFromContext(ctx)); ok {
		traceparent = tp
		if ts != "" {
			b, err := json.Marshal(map[string]string{tracing.HeaderTraceState: ts})
			if err != nil {
				return err
			}
			headers = string(b)
		}
	}
	var id string
	if err := tx.QueryRow(ctx, w.query, ev.AggregateType, ev.AggregateID, ev.Type, string(ev.Payload),
		headers, traceparent).Scan(&id); err != nil {
		return fmt.Errorf("enqueue %s: %w", ev.Type, err)
	}
	return nil
}
