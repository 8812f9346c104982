package outboxcdc

// The stream: one replication connection reading the slot, decoding the
// outbox table's committed inserts in commit order, publishing their ids
// through Relay.PublishIDs and confirming the slot's position behind them.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/outbox/internal/failpoint"
)

// stream is one streaming session of the slot. It is used by one goroutine.
type stream struct {
	cfg  Config
	conn *pgconn.PgConn
	log  *slog.Logger
	st   *Stats

	// rels maps a relation id to the index of its event_id column, or -1
	// for a relation that is not the outbox table.
	rels  map[uint32]int
	inTx  bool
	txIDs []uuid.UUID // the ids of the transaction being received

	// pending holds the ids of the complete transactions received and not
	// yet handed to PublishIDs, in commit order; pendingEnd is the end LSN
	// of the last complete transaction received (pending or not).
	pending      []uuid.UUID
	pendingEnd   pglogrepl.LSN
	pendingSince time.Time
	// confirmed is the position reported to PostgreSQL as flushed: every
	// transaction ending at or before it was handed to PublishIDs.
	confirmed  pglogrepl.LSN
	nextStatus time.Time
}

// run reads the stream until ctx ends or the connection fails.
func (s *stream) run(ctx context.Context) error {
	s.nextStatus = time.Now().Add(s.cfg.StatusInterval)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.flushDue() {
			if err := s.flush(ctx); err != nil {
				return err
			}
		}
		deadline := s.nextStatus
		if len(s.pending) > 0 {
			if d := s.pendingSince.Add(s.cfg.FlushInterval); d.Before(deadline) {
				deadline = d
			}
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if !time.Now().Before(s.nextStatus) {
					if err := s.sendStatus(false); err != nil {
						return err
					}
				}
				continue
			}
			return fmt.Errorf("receive from the replication stream: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		}
	}
}

func (s *stream) handleCopyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		// With no transaction open and nothing waiting, everything the
		// server decoded up to ServerWALEnd was received and handled (the
		// keepalive follows the data on the connection), so the slot may
		// move there: it stops holding WAL written by other tables.
		if !s.inTx && len(s.pending) == 0 && k.ServerWALEnd > s.confirmed {
			s.confirmed = k.ServerWALEnd
		}
		if k.ReplyRequested {
			return s.sendStatus(false)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse WAL data: %w", err)
		}
		return s.handleLogical(x.WALData)
	}
	return nil
}

// handleLogical decodes one pgoutput message (protocol version 1).
func (s *stream) handleLogical(data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		idx := -1
		if m.Namespace == s.cfg.Schema && m.RelationName == "outbox_events" {
			for i, c := range m.Columns {
				if c.Name == "event_id" {
					idx = i
				}
			}
			if idx < 0 {
				return fmt.Errorf("relation %s.outbox_events in the stream has no event_id column", m.Namespace)
			}
		}
		s.rels[m.RelationID] = idx
	case *pglogrepl.BeginMessage:
		s.inTx, s.txIDs = true, s.txIDs[:0]
	case *pglogrepl.InsertMessage:
		idx, ok := s.rels[m.RelationID]
		if !ok {
			return fmt.Errorf("insert into relation %d before its description", m.RelationID)
		}
		if idx < 0 || m.Tuple == nil {
			return nil
		}
		if idx >= len(m.Tuple.Columns) || m.Tuple.Columns[idx].DataType != pglogrepl.TupleDataTypeText {
			return errors.New("an outbox insert in the stream carries no event_id in text form")
		}
		id, err := uuid.ParseBytes(m.Tuple.Columns[idx].Data)
		if err != nil {
			return fmt.Errorf("event_id in the stream: %w", err)
		}
		s.txIDs = append(s.txIDs, id)
	case *pglogrepl.CommitMessage:
		if len(s.txIDs) > 0 {
			if len(s.pending) == 0 {
				s.pendingSince = time.Now()
			}
			s.pending = append(s.pending, s.txIDs...)
			s.st.received.Add(int64(len(s.txIDs)))
		}
		s.inTx, s.txIDs = false, s.txIDs[:0]
		s.pendingEnd = m.TransactionEndLSN
	}
	return nil
}

// flushDue reports whether the pending ids should be published now: a
// batch is full, the oldest waited FlushInterval, or only transactions
// without outbox inserts moved the position.
func (s *stream) flushDue() bool {
	switch {
	case len(s.pending) >= s.cfg.BatchSize:
		return true
	case len(s.pending) > 0:
		return !time.Now().Before(s.pendingSince.Add(s.cfg.FlushInterval))
	default:
		return !s.inTx && s.pendingEnd > s.confirmed
	}
}

// flush hands the pending ids to PublishIDs, BatchSize at a time (see
// publish), and then confirms the end of the last transaction received. On
// an outage or a database error it waits and retries the same ids, without
// confirming, as long as the connection lives: nothing past a transaction
// whose ids were not handed over successfully is ever confirmed.
func (s *stream) flush(ctx context.Context) error {
	for len(s.pending) > 0 {
		chunk := s.pending[:min(len(s.pending), s.cfg.BatchSize)]
		if err := s.publish(ctx, chunk); err != nil {
			return err
		}
		s.pending = s.pending[len(chunk):]
	}
	s.pending = s.pending[:0]
	if err := failpoint.Hit("cdc/before-confirm"); err != nil {
		return err
	}
	if s.pendingEnd > s.confirmed {
		s.confirmed = s.pendingEnd
	}
	return s.sendStatus(false)
}

// missingRetries bounds the retries of ids not found in the table: the
// first waits 1ms, each next one twice as long (about half a second in
// all).
const missingRetries = 9

// publish hands ids to PublishIDs until each is published or left to the
// polling path. Ids not found in the table are retried shortly: the WAL
// delivers a commit a moment before the transaction is visible to other
// sessions. After missingRetries they are left too (clean-up may have
// deleted them, when the stream replays old transactions).
func (s *stream) publish(ctx context.Context, ids []uuid.UUID) error {
	failures, missingTries := 0, 0
	for len(ids) > 0 {
		if err := failpoint.Hit("cdc/before-publish"); err != nil {
			return err
		}
		res, err := s.cfg.Relay.PublishIDs(ctx, ids)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failures++
			d := jitter(failures, s.cfg.RetryMin, s.cfg.RetryMax)
			s.log.Warn("cdc publish failed; retrying the same events", slog.Int("events", len(ids)), slog.Any("error", err), slog.Duration("retry_in", d))
			if err := s.wait(ctx, d); err != nil {
				return err
			}
			continue
		case res.Unavailable:
			failures++
			s.st.outages.Add(1)
			s.log.Warn("destination unavailable; keeping the slot's position and retrying the same events",
				slog.Int("events", len(ids)), slog.Duration("retry_in", res.RetryIn))
			if err := s.wait(ctx, res.RetryIn); err != nil {
				return err
			}
			continue
		}
		failures = 0
		s.st.published.Add(int64(res.Published))
		if len(res.Missing) == 0 || missingTries == missingRetries {
			s.st.left.Add(int64(res.Left))
			if len(res.Missing) > 0 {
				s.log.Warn("events read from the WAL are not in the table; leaving them to the polling path", slog.Int("events", len(res.Missing)))
			}
			return nil
		}
		s.st.left.Add(int64(res.Left - len(res.Missing)))
		missingTries++
		ids = res.Missing
		if err := s.wait(ctx, time.Millisecond<<(missingTries-1)); err != nil {
			return err
		}
	}
	return nil
}

// wait sleeps d while keeping the replication connection alive.
func (s *stream) wait(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		t := time.NewTimer(min(left, s.cfg.StatusInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(false); err != nil {
				return err
			}
		}
	}
}

// sendStatus reports the confirmed position as written, flushed and
// applied.
func (s *stream) sendStatus(reply bool) error {
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, WALFlushPosition: s.confirmed, WALApplyPosition: s.confirmed, ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	s.st.confirmed.Store(uint64(s.confirmed))
	s.nextStatus = time.Now().Add(s.cfg.StatusInterval)
	return nil
}

// jitter is an exponential backoff for the n-th consecutive failure, capped
// at max, between half and all of it.
func jitter(n int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2+1)
}
