package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// ReadMessage reads event id as the relay's claim would hand it to a
// destination (same columns, same decoding), for tests in package outbox_test.
func ReadMessage(ctx context.Context, pool *pgxpool.Pool, schema string, id uuid.UUID) (Message, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return Message{}, err
	}
	events := s.Table("outbox_events")
	var row messageRow
	if err := pool.QueryRow(ctx, `SELECT `+messageColumns(events, "e")+` FROM `+events+` e WHERE e.event_id = $1`, id).Scan(row.dest()...); err != nil {
		return Message{}, err
	}
	return row.decode()
}

// SweepLanes runs the relay's lane sweep once on schema, for tests.
func SweepLanes(ctx context.Context, pool *pgxpool.Pool, schema string) (laneSweep, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return laneSweep{}, err
	}
	return sweepLanes(ctx, pool, s)
}

// testSpanContext is a valid sampled span context, for benchmarks.
func testSpanContext() trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
}

// HoldBackgroundMarks makes r's PublishIDs background marks wait until the
// returned function is called, for tests. Call it before r is used.
func HoldBackgroundMarks(r *Relay) (release func()) {
	held := make(chan struct{})
	r.testHookMarks = func() { <-held }
	var once sync.Once
	return func() { once.Do(func() { close(held) }) }
}

// ClaimIDsStatements returns PublishIDs's claim and missing-ids statements
// for schema, for plan tests.
func ClaimIDsStatements(schema string) (claim, missing string, err error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return "", "", err
	}
	events := s.Table("outbox_events")
	return claimIDsSQL(events), missingIDsSQL(events), nil
}

// FreshClaimStatement returns the incremental claim statement for schema
// and a relay of batchSize, for plan tests.
func FreshClaimStatement(schema string, batchSize int) (string, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return "", err
	}
	return fastClaimSQL(s.Table("outbox_events"), batchSize, "", false), nil
}

// HandOffStatement returns the statement that makes lanes' next events due
// (handOffSkipSQL) for schema, for plan tests.
func HandOffStatement(schema string) (string, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return "", err
	}
	return handOffSkipSQL(s.Table("outbox_events")), nil
}

// QuarantineStatements returns the statements that look for quarantined
// events, by name, as the relay and Admin run them (no filter).
func QuarantineStatements(schema string) (map[string]string, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return nil, err
	}
	events := s.Table("outbox_events")
	return map[string]string{
		"sweep":   sweepFindSQL(events, s.Table("outbox_aggregates")),
		"blocked": blockedByQuarantineSQL(events),
		"list":    quarantineListSQL(events, ""),
		"count":   quarantineCountSQL(events, ""),
	}, nil
}

// ExplainLook runs the background full scan's look under EXPLAIN (ANALYZE,
// BUFFERS): from the relay's low-water mark, or from the start when
// complete. The cursor is not changed.
func (r *Relay) ExplainLook(ctx context.Context, complete bool) (string, error) {
	r.partitionAware(ctx)
	r.cursor.mu.Lock()
	from := r.cursor.low
	r.cursor.mu.Unlock()
	if complete || !from.avail.Valid {
		from = lowMarkStart
	}
	xmax, xip := from.lateArgs()
	rows, err := r.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+r.sql.look, from.avail, from.occ, xmax, xip)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return "", err
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n"), rows.Err()
}

// LookLow is the available_at of the relay's low-water mark (zero: none or
// -infinity).
func (r *Relay) LookLow() time.Time {
	r.cursor.mu.Lock()
	defer r.cursor.mu.Unlock()
	if !r.cursor.low.avail.Valid || r.cursor.low.avail.InfinityModifier != 0 {
		return time.Time{}
	}
	return r.cursor.low.avail.Time
}

// ClaimCost is what one claim statement cost under EXPLAIN (ANALYZE,
// BUFFERS, FORMAT JSON): the shared buffers its execution touched (hit and
// read) and its planning and execution times.
type ClaimCost struct {
	Buffers       int64
	Planning, Run time.Duration
}

// ClaimCostOf runs one of r's claim statements ("claim": the full scan's
// one-statement claim; "fresh": the incremental claim from where the cursor
// stands; "look": the background full scan's complete look) under EXPLAIN
// (ANALYZE, BUFFERS, FORMAT JSON) in a transaction it rolls back, for
// tests. Nothing is claimed and the cursor does not move. raw keeps the
// statements as NewRelay made them (a plain table's), for figures of the
// claim before partitionAware.
func ClaimCostOf(ctx context.Context, r *Relay, which string, raw bool) (ClaimCost, error) {
	sql, args, err := ClaimStatementOf(ctx, r, which, raw)
	if err != nil {
		return ClaimCost{}, err
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return ClaimCost{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var doc []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&doc); err != nil {
		return ClaimCost{}, err
	}
	var out []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		}
		Planning float64 `json:"Planning Time"`
		Run      float64 `json:"Execution Time"`
	}
	if err := json.Unmarshal(doc, &out); err != nil || len(out) != 1 {
		return ClaimCost{}, fmt.Errorf("read the plan: %v (%d plans)", err, len(out))
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	return ClaimCost{Buffers: out[0].Plan.Hit + out[0].Plan.Read, Planning: ms(out[0].Planning), Run: ms(out[0].Run)}, nil
}

// ClaimStatementOf returns one of r's claim statements ("claim", "fresh",
// "look": see ClaimCostOf) and its arguments, as the relay would run it
// now, for tests that run it themselves. raw keeps the statements as
// NewRelay made them (a plain table's). The cursor does not move.
func ClaimStatementOf(ctx context.Context, r *Relay, which string, raw bool) (string, []any, error) {
	if !raw {
		r.partitionAware(ctx)
	}
	switch which {
	case "claim":
		return r.sql.claim, []any{r.cfg.BatchSize, r.cfg.ID, uuid.New(), r.cfg.LeaseDuration.Milliseconds()}, nil
	case "fresh":
		if !r.cursor.isValid() {
			if err := r.startCursor(ctx); err != nil {
				return "", nil, err
			}
		}
		fresh, cont := r.cursor.freshArgs()
		r.cursor.restore(cont)
		return r.sql.fastClaim, append([]any{r.cfg.BatchSize, r.cfg.ID, uuid.New(), r.cfg.LeaseDuration.Milliseconds()}, fresh...), nil
	case "look":
		xmax, xip := lowMarkStart.lateArgs()
		return r.sql.look, []any{lowMarkStart.avail, lowMarkStart.occ, xmax, xip}, nil
	}
	return "", nil, fmt.Errorf("no claim statement %q", which)
}

// ErrUpkeepBusy is errUpkeepBusy, for tests that clean up beside a
// running relay's partition upkeep.
var ErrUpkeepBusy = errUpkeepBusy

// SetPartitionCheckEvery makes r's partition loop run every d instead of
// every minute (before r.Run).
func SetPartitionCheckEvery(r *Relay, d time.Duration) { r.testPartitionEvery = d }
