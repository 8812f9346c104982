package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Defaults for ReplayConfig.
const (
	ReplayBatchSizeDefault    = 500
	ReplayMaxAttemptsDefault  = 5
	ReplayRetryBackoffDefault = time.Second
)

// ReplayConfig selects the events Admin.Replay publishes again. The filters
// combine; the zero value replays every published event still kept.
type ReplayConfig struct {
	// AggregateType, when set, selects that aggregate type; AggregateID,
	// when set, that aggregate id.
	AggregateType string
	AggregateID   string
	// Since and Until, when not zero, select events whose occurred_at is at
	// or after Since and before Until.
	Since, Until time.Time
	// By names who replays, for the audit log. Required.
	By string
	// BatchSize is the number of events read per query. Defaults to
	// ReplayBatchSizeDefault.
	BatchSize int
	// MaxAttempts is how many times a message that failed with a retryable
	// or unavailable error is sent before the replay gives up. Defaults to
	// ReplayMaxAttemptsDefault.
	MaxAttempts int
	// RetryBackoff is the first pause before a retry; it doubles each time
	// (with jitter), up to 30 s. Defaults to ReplayRetryBackoffDefault.
	RetryBackoff time.Duration
	// Progress, when set, is called after each batch.
	Progress func(ReplayProgress)
}

// ReplayProgress reports a replay's progress.
type ReplayProgress struct {
	// ReplayID identifies the run.
	ReplayID uuid.UUID
	// Replayed is the number of events acknowledged by the destination so
	// far; Total the number selected when the replay started.
	Replayed, Total int64
	// Elapsed is the time since the replay started.
	Elapsed time.Duration
}

// ReplayResult is what a replay did.
type ReplayResult struct {
	// ReplayID identifies the run: in each message (Message.ReplayID) and in
	// the audit log.
	ReplayID uuid.UUID `json:"replay_id"`
	// Events is the number of events published again; Aggregates the number
	// of aggregates they belong to.
	Events     int64 `json:"events"`
	Aggregates int64 `json:"aggregates"`
	// Duration is how long the replay took.
	Duration time.Duration `json:"-"`
}

func (c ReplayConfig) validate() error {
	switch {
	case c.By == "":
		return ErrActorRequired
	case !c.Since.IsZero() && !c.Until.IsZero() && !c.Until.After(c.Since):
		return fmt.Errorf("time range is empty: until %s is not after since %s", c.Until.Format(time.RFC3339), c.Since.Format(time.RFC3339))
	case c.BatchSize < 0:
		return fmt.Errorf("batch size %d is negative", c.BatchSize)
	case c.MaxAttempts < 0:
		return fmt.Errorf("max attempts %d is negative", c.MaxAttempts)
	case c.RetryBackoff < 0:
		return fmt.Errorf("retry backoff %s is negative", c.RetryBackoff)
	}
	return nil
}

// replayFilter builds the WHERE clause of a replay: published, not skipped
// events matching the filters. Arguments start at $1.
func (c ReplayConfig) filter() (string, []any) {
	where := []string{"e.published_at IS NOT NULL", "e.skipped_at IS NULL"}
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(args))))
	}
	if c.AggregateType != "" {
		add("e.aggregate_type = $?", c.AggregateType)
	}
	if c.AggregateID != "" {
		add("e.aggregate_id = $?", c.AggregateID)
	}
	if !c.Since.IsZero() {
		add("e.occurred_at >= $?", c.Since)
	}
	if !c.Until.IsZero() {
		add("e.occurred_at < $?", c.Until)
	}
	return strings.Join(where, " AND "), args
}

// ReplayCount returns how many events cfg selects.
func (a *Admin) ReplayCount(ctx context.Context, cfg ReplayConfig) (int64, error) {
	where, args := cfg.filter()
	var n int64
	if err := a.db.QueryRow(ctx, `SELECT count(*) FROM `+a.t.events+` e WHERE `+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count events to replay: %w", err)
	}
	return n, nil
}

// Replay publishes already-published events again through pub, with their
// original ids (so inboxes drop what they have applied) and a fresh
// Message.ReplayID, in per-aggregate order: an aggregate's event k+1 is sent
// only after the destination acknowledged k. Skipped events are not
// replayed. The events are read in pages in (aggregate type, aggregate id,
// sequence) order; within a page, the i-th event of every aggregate goes out
// in one Publish call.
//
// Replay does not coordinate with running relays: an aggregate's new events
// may reach the broker before the replayed old ones, which inboxes treat as
// duplicates or, for a consumer that never saw them, apply in order after
// the replayed ones. It stops at the first event the destination refuses
// permanently, or that still fails after MaxAttempts; the result then counts
// what was replayed, and running the replay again is safe.
func (a *Admin) Replay(ctx context.Context, pub Publisher, cfg ReplayConfig) (ReplayResult, error) {
	res := ReplayResult{ReplayID: uuid.New()}
	if pub == nil {
		return res, errors.New("outbox: replay needs a publisher")
	}
	if err := cfg.validate(); err != nil {
		return res, fmt.Errorf("outbox: replay: %w", err)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = ReplayBatchSizeDefault
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = ReplayMaxAttemptsDefault
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = ReplayRetryBackoffDefault
	}
	start := time.Now()
	total, err := a.ReplayCount(ctx, cfg)
	if err != nil {
		return res, err
	}
	filters := map[string]any{"replay_id": res.ReplayID, "selected": total}
	if cfg.AggregateType != "" {
		filters["aggregate_type"] = cfg.AggregateType
	}
	if cfg.AggregateID != "" {
		filters["aggregate_id"] = cfg.AggregateID
	}
	if !cfg.Since.IsZero() {
		filters["since"] = cfg.Since.UTC()
	}
	if !cfg.Until.IsZero() {
		filters["until"] = cfg.Until.UTC()
	}
	detail, _ := json.Marshal(filters)
	var opID int64
	if err := a.db.QueryRow(ctx, `INSERT INTO `+a.t.operations+` (action, actor, detail) VALUES ('replay', $1, $2::text::jsonb) RETURNING operation_id`,
		cfg.By, string(detail)).Scan(&opID); err != nil {
		return res, fmt.Errorf("outbox: replay: record operation: %w", err)
	}

	err = a.replay(ctx, pub, cfg, &res, total, start)
	res.Duration = time.Since(start)
	outcome := "done"
	if err != nil {
		outcome = "failed: " + truncate(err.Error(), 500)
	}
	// replay_finished (migration 011) writes the outcome into this replay's
	// own audit row, once: the operator role may not update the audit log.
	if _, uerr := a.db.Exec(context.WithoutCancel(ctx), `SELECT `+a.schema.Quoted()+`.replay_finished($1, $2, $3, $4)`,
		opID, res.Events, res.Aggregates, outcome); uerr != nil && err == nil {
		err = fmt.Errorf("record operation: %w", uerr)
	}
	if err != nil {
		return res, fmt.Errorf("outbox: replay %s (%d of %d events replayed): %w", res.ReplayID, res.Events, total, err)
	}
	return res, nil
}

type replayKey struct {
	typ, id string
	seq     int64
}

func (a *Admin) replay(ctx context.Context, pub Publisher, cfg ReplayConfig, res *ReplayResult, total int64, start time.Time) error {
	where, args := cfg.filter()
	n := len(args)
	pageSQL := func(after bool) string {
		q := `SELECT ` + messageColumns(a.t.events, "e") + `
FROM ` + a.t.events + ` e
WHERE ` + where
		if after {
			q += fmt.Sprintf(" AND (e.aggregate_type, e.aggregate_id, e.aggregate_sequence) > ($%d, $%d, $%d)", n+2, n+3, n+4)
		}
		return q + fmt.Sprintf("\nORDER BY e.aggregate_type, e.aggregate_id, e.aggregate_sequence\nLIMIT $%d", n+1)
	}
	first, next := pageSQL(false), pageSQL(true)
	var last *replayKey
	for {
		q, qargs := first, append(append([]any{}, args...), cfg.BatchSize)
		if last != nil {
			q, qargs = next, append(qargs, last.typ, last.id, last.seq)
		}
		rows, err := a.db.Query(ctx, q, qargs...)
		if err != nil {
			return fmt.Errorf("read events: %w", err)
		}
		page, err := pgtx.Collect(rows, func(row pgtx.Row) (Message, error) {
			var r messageRow
			if err := row.Scan(r.dest()...); err != nil {
				return Message{}, err
			}
			m, err := r.decode()
			if err != nil {
				return m, fmt.Errorf("event %s: %w", m.ID, err)
			}
			m.ReplayID, m.Attempt = res.ReplayID, 1
			return m, nil
		})
		if err != nil {
			return fmt.Errorf("read events: %w", err)
		}
		if len(page) == 0 {
			return nil
		}
		// Rows are ordered by aggregate, so each lane is a run of rows.
		var lanes [][]Message
		for i, m := range page {
			if i == 0 || m.AggregateType != page[i-1].AggregateType || m.AggregateID != page[i-1].AggregateID {
				lanes = append(lanes, nil)
				if last == nil || m.AggregateType != last.typ || m.AggregateID != last.id {
					res.Aggregates++
				}
			}
			lanes[len(lanes)-1] = append(lanes[len(lanes)-1], m)
		}
		for wave := 0; ; wave++ {
			var msgs []Message
			for _, lane := range lanes {
				if wave < len(lane) {
					msgs = append(msgs, lane[wave])
				}
			}
			if len(msgs) == 0 {
				break
			}
			if err := a.replayWave(ctx, pub, cfg, msgs); err != nil {
				return err
			}
			res.Events += int64(len(msgs))
		}
		l := page[len(page)-1]
		last = &replayKey{l.AggregateType, l.AggregateID, l.Sequence}
		if cfg.Progress != nil {
			cfg.Progress(ReplayProgress{ReplayID: res.ReplayID, Replayed: res.Events, Total: total, Elapsed: time.Since(start)})
		}
		if len(page) < cfg.BatchSize {
			return nil
		}
	}
}

// replayWave publishes msgs (at most one per aggregate) until all are
// acknowledged, retrying failures up to MaxAttempts.
func (a *Admin) replayWave(ctx context.Context, pub Publisher, cfg ReplayConfig, msgs []Message) error {
	for attempt := 1; ; attempt++ {
		for i := range msgs {
			msgs[i].Attempt = attempt
		}
		errs := pub.Publish(ctx, msgs)
		if errs == nil {
			return nil
		}
		if len(errs) != len(msgs) {
			return fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
		}
		var failed []Message
		var lastErr error
		for i, err := range errs {
			if err == nil {
				continue
			}
			if IsPermanent(err) {
				return fmt.Errorf("event %s (%s %s #%d) refused: %w", msgs[i].ID, msgs[i].AggregateType, msgs[i].AggregateID, msgs[i].Sequence, err)
			}
			failed = append(failed, msgs[i])
			lastErr = err
		}
		if len(failed) == 0 {
			return nil // a publisher that returned only nil errors (the contract says nil)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if attempt >= cfg.MaxAttempts {
			return fmt.Errorf("%d events still failing after %d attempts, e.g. %s: %w", len(failed), attempt, failed[0].ID, lastErr)
		}
		sleep(ctx, backoff(attempt, cfg.RetryBackoff, max(cfg.RetryBackoff, 30*time.Second)))
		msgs = failed
	}
}
