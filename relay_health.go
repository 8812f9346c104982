package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/redact"
)

// RelayHealth is what a relay last recorded of its health in its heartbeat
// row (outbox_relays.health, migration 015): what its /readyz says (Ready),
// since when it is not ready, its last error, and how many events it
// published and how many publish attempts failed in each minute of the last
// hour. The relay writes it after each heartbeat, so it is at most one
// HeartbeatInterval old while the relay lives (RecordedAt says).
type RelayHealth struct {
	// Ready reports that Relay.Ready returned nil; Reason is its error
	// otherwise (the text /readyz answers, secrets in URLs redacted).
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// NotReadySince is when the relay was first seen not ready in the
	// current spell (nil while ready).
	NotReadySince *time.Time `json:"not_ready_since,omitempty"`
	// LastError is the last reason the relay was not ready, kept after it
	// recovered, and LastErrorAt when it was last seen.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// RecordedAt is when the relay wrote this, by its clock.
	RecordedAt time.Time `json:"recorded_at"`
	// Minutes are the relay's counts per minute (by its clock), oldest
	// first, for the minutes of the last hour it ran in.
	Minutes []RelayMinute `json:"minutes,omitempty"`
}

// RelayMinute is one minute of a relay's work.
type RelayMinute struct {
	Minute    time.Time `json:"minute"`
	Published int64     `json:"published"`
	Failed    int64     `json:"failed"`
}

// healthWindow is how far back RelayHealth.Minutes go.
const healthWindow = time.Hour

// healthRecorder keeps what the heartbeat records of the relay's health. It
// is owned by the heartbeat goroutine.
type healthRecorder struct {
	sql string
	// off: the schema has no health column (not migrated to 015).
	off               bool
	notReadySince     time.Time
	lastErr           string
	lastErrAt         time.Time
	published, failed int64 // the totals at the previous note
	minutes           []RelayMinute
	// recorded: a health was written; recordedReason is its Reason.
	recorded       bool
	recordedReason string
}

func newHealthRecorder(s pgident.Schema) *healthRecorder {
	return &healthRecorder{sql: `UPDATE ` + s.Table("outbox_relays") + ` SET health = $2::jsonb WHERE relay_id = $1`}
}

// note folds in the relay's readiness and totals at now and returns the
// health to record.
func (h *healthRecorder) note(now time.Time, ready error, published, failed int64) RelayHealth {
	now = now.UTC()
	out := RelayHealth{Ready: ready == nil, RecordedAt: now}
	if ready != nil {
		out.Reason = redact.Text(ready.Error())
		if h.notReadySince.IsZero() {
			h.notReadySince = now
		}
		if !errors.Is(ready, errNotStarted) {
			// Starting is not an error worth keeping once it is over.
			h.lastErr, h.lastErrAt = out.Reason, now
		}
		since := h.notReadySince
		out.NotReadySince = &since
	} else {
		h.notReadySince = time.Time{}
	}
	if h.lastErr != "" {
		at := h.lastErrAt
		out.LastError, out.LastErrorAt = h.lastErr, &at
	}
	m := now.Truncate(time.Minute)
	dp, df := max(published-h.published, 0), max(failed-h.failed, 0)
	h.published, h.failed = published, failed
	if n := len(h.minutes); n > 0 && h.minutes[n-1].Minute.Equal(m) {
		h.minutes[n-1].Published += dp
		h.minutes[n-1].Failed += df
	} else {
		h.minutes = append(h.minutes, RelayMinute{Minute: m, Published: dp, Failed: df})
	}
	cut := 0
	for cut < len(h.minutes) && h.minutes[cut].Minute.Before(m.Add(-healthWindow)) {
		cut++
	}
	h.minutes = append(h.minutes[:0], h.minutes[cut:]...)
	out.Minutes = append([]RelayMinute(nil), h.minutes...)
	return out
}

// recordHealth writes the relay's health into its heartbeat row. A schema
// without the column (not migrated to 015) turns the recording off for the
// relay's life, with one line in the log; any other failure is left to the
// next heartbeat.
func (r *Relay) recordHealth(ctx context.Context, h *healthRecorder) {
	st := r.Stats()
	ready := r.Ready()
	reason := ""
	if ready != nil {
		reason = redact.Text(ready.Error())
	}
	if r.cfg.IdleBackoffMax > 0 && h.recorded && r.idle.idleFor(time.Now()) > 0 &&
		st.Published == h.published && st.Failed == h.failed && reason == h.recordedReason {
		// Idle and unchanged (IdleBackoffMax): the row already says so.
		return
	}
	doc := h.note(time.Now(), ready, st.Published, st.Failed)
	if h.off {
		return
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return
	}
	_, err = r.pool.Exec(ctx, h.sql, r.cfg.ID, string(b))
	if err == nil {
		h.recorded, h.recordedReason = true, doc.Reason
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column
			h.off = true
			r.log.Info("relay health not recorded in outbox_relays: the schema has no health column (run outbox migrate: migration 015)")
			return
		}
		if ctx.Err() == nil {
			r.log.Debug("record relay health", slog.Any("error", err))
		}
	}
}
