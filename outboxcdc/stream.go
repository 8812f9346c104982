package outboxcdc

// The stream: one replication connection reading the slot, decoding the
// outbox table's committed inserts in commit order, publishing their ids
// through Relay.PublishIDs and confirming the slot's position behind them.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgoutbox/outbox/internal/backoff"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/outbox"
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

	// txns are the complete transactions received and not yet confirmed,
	// in commit order, each with the count of its ids not yet handed over.
	txns []*txn
	// fresh are the ids not yet handed to PublishIDs, in commit order;
	// freshSince is when the oldest of them arrived.
	fresh      []pendingID
	freshSince time.Time
	// waiting are ids PublishIDs did not find in the table yet (see
	// missingFor); they ride along with the next calls. lastFlush is when
	// the last call was made.
	waiting   []pendingID
	lastFlush time.Time
	// handed is the end of the last transaction of the unbroken run of
	// transactions whose ids were all handed to PublishIDs; confirmed is the
	// position reported to PostgreSQL as flushed: handed, once the marks of
	// the calls that handed those ids over were written (see confirm).
	handed, confirmed pglogrepl.LSN
	handedEvents      bool // handed covers events not confirmed yet
	nextConfirm       time.Time
	nextStatus        time.Time
	// catchingUp: the stream was not read during the last PublishIDs call
	// (callStart is when it began), and what the connection buffered
	// meanwhile is being read (see readDeadline and flushDue).
	catchingUp bool
	callStart  time.Time
}

// catchUpWait is how long a read waits for more while the stream catches up
// after a PublishIDs call: what arrived during the call is buffered on the
// connection and read at once, and the first read that waits this long
// finds the stream caught up.
const catchUpWait = 200 * time.Microsecond

// txn is a complete transaction of the stream.
type txn struct {
	end    pglogrepl.LSN // its end LSN, confirmed once open is 0
	open   int           // its ids not yet handed over
	hasIDs bool          // it inserted events
}

// pendingID is an id waiting to be handed over, with its transaction.
type pendingID struct {
	id    uuid.UUID
	tx    *txn
	since time.Time // when PublishIDs first did not find it (zero: not yet)
}

// missingFor is how long an id PublishIDs does not find is retried before
// it is left to the polling path. PostgreSQL sends a commit to the stream
// a moment before the transaction is visible to other sessions; an id
// missing for longer was deleted (clean-up, when old transactions are read
// again) or its backend is starved, and the safety net takes it.
const missingFor = time.Second

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
		deadline := s.readDeadline()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				s.catchingUp = false
				if err := s.confirm(ctx); err != nil {
					return err
				}
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

// readDeadline is when the next read stops waiting: at the next status
// update, or when fresh ids or ids not found before are due; while the
// stream catches up after a call, as soon as nothing more is buffered.
func (s *stream) readDeadline() time.Time {
	if s.catchingUp {
		return time.Now().Add(catchUpWait)
	}
	deadline := s.nextStatus
	if s.handed > s.confirmed && s.nextConfirm.Before(deadline) {
		deadline = s.nextConfirm
	}
	if len(s.fresh) > 0 {
		if d := s.freshSince.Add(s.cfg.FlushInterval); d.Before(deadline) {
			deadline = d
		}
	}
	if len(s.waiting) > 0 {
		if d := s.lastFlush.Add(s.retryWaiting()); d.Before(deadline) {
			deadline = d
		}
	}
	return deadline
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
		if !s.inTx && len(s.txns) == 0 && k.ServerWALEnd > s.handed {
			s.handed = k.ServerWALEnd
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
		t := &txn{end: m.TransactionEndLSN, open: len(s.txIDs), hasIDs: len(s.txIDs) > 0}
		s.txns = append(s.txns, t)
		if len(s.txIDs) > 0 {
			if len(s.fresh) == 0 {
				s.freshSince = time.Now()
				if s.catchingUp {
					// It arrived during the last call, and has waited
					// since, as long as a FlushInterval or longer.
					s.freshSince = s.callStart
				}
			}
			for _, id := range s.txIDs {
				s.fresh = append(s.fresh, pendingID{id: id, tx: t})
			}
			s.st.received.Add(int64(len(s.txIDs)))
		}
		s.inTx, s.txIDs = false, s.txIDs[:0]
	}
	return nil
}

// flushDue reports whether to call PublishIDs or confirm now: a batch is
// full, the oldest fresh id waited FlushInterval, ids not found before are
// due for another try, or transactions whose ids were all handed over (or
// that had none) wait to be confirmed. While the stream catches up after a
// call, only a full batch is due: the ids buffered during the call go out
// together once they are read.
func (s *stream) flushDue() bool {
	now := time.Now()
	switch {
	case len(s.fresh) >= s.cfg.BatchSize:
		return true
	case s.catchingUp:
		return false
	case len(s.fresh) > 0 && !now.Before(s.freshSince.Add(s.cfg.FlushInterval)):
		return true
	case len(s.waiting) > 0 && !now.Before(s.lastFlush.Add(s.retryWaiting())):
		return true
	}
	return len(s.txns) > 0 && s.txns[0].open == 0
}

// retryWaiting is the pause before ids not found are tried again.
func (s *stream) retryWaiting() time.Duration { return max(s.cfg.FlushInterval, time.Millisecond) }

// flush hands the waiting and fresh ids to PublishIDs, BatchSize at a time
// (see publish), then moves handed to the end of the last transaction of
// the unbroken run of transactions whose ids were all handed over, and
// confirms it when due (see confirm). Ids not found in the table stay
// waiting, and their transactions unconfirmed, for up to missingFor; the
// stream goes on meanwhile. On an outage or a database error
// publish waits and retries the same ids: nothing past a transaction whose
// ids were not handed over successfully is ever confirmed.
func (s *stream) flush(ctx context.Context) error {
	retry := len(s.waiting) > 0 && !time.Now().Before(s.lastFlush.Add(s.retryWaiting()))
	for len(s.fresh) > 0 || retry {
		var batch []pendingID
		if retry {
			batch, s.waiting, retry = s.waiting, nil, false
		}
		n := min(len(s.fresh), max(s.cfg.BatchSize-len(batch), 0))
		batch = append(batch, s.fresh[:n]...)
		s.fresh = s.fresh[n:]
		if err := s.publish(ctx, batch); err != nil {
			return err
		}
	}
	if len(s.fresh) == 0 {
		s.fresh = nil
	}
	for len(s.txns) > 0 && s.txns[0].open == 0 {
		s.handed = max(s.handed, s.txns[0].end)
		s.handedEvents = s.handedEvents || s.txns[0].hasIDs
		s.txns = s.txns[1:]
	}
	return s.confirm(ctx)
}

// confirmInterval is how often, at most, the stream confirms its position
// while it publishes: each confirmation first waits for the marks being
// written in the background (Relay.WaitPublishIDs).
const confirmInterval = 100 * time.Millisecond

// confirm reports handed to PostgreSQL as flushed when it moved and
// confirmInterval passed since the last confirmation, after the marks of
// what was handed over were written: a relay that dies before then reads
// those transactions again and finds their events published, instead of
// leaving events acknowledged, unmarked and leased to the safety net.
func (s *stream) confirm(ctx context.Context) error {
	if s.handed <= s.confirmed || time.Now().Before(s.nextConfirm) {
		return nil
	}
	if err := s.cfg.Relay.WaitPublishIDs(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The events stay leased, unmarked; the safety net publishes them
		// again once the lease expired (at least once). Reading them again
		// would find them leased all the same.
		s.log.Warn("marking events published failed; the safety net publishes them again when their lease expires", slog.Any("error", err))
	}
	if s.handedEvents {
		if err := failpoint.Hit("cdc/before-confirm"); err != nil {
			return err
		}
	}
	s.confirmed, s.handedEvents = s.handed, false
	s.nextConfirm = time.Now().Add(confirmInterval)
	return s.sendStatus(false)
}

// publish hands a batch to PublishIDs: on a database error or an outage it
// waits and calls again with the same ids, as long as the connection lives;
// then every id is handed over, except those PublishIDs did not find, which
// wait (for up to missingFor since they were first missed).
func (s *stream) publish(ctx context.Context, batch []pendingID) error {
	ids := make([]uuid.UUID, len(batch))
	for i, p := range batch {
		ids[i] = p.id
	}
	var res outbox.PublishIDsResult
	for failures := 1; ; failures++ {
		if err := failpoint.Hit("cdc/before-publish"); err != nil {
			return err
		}
		var err error
		s.callStart = time.Now()
		res, err = s.cfg.Relay.PublishIDs(ctx, ids)
		s.lastFlush = time.Now()
		s.catchingUp = true
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d := jitter(failures, s.cfg.RetryMin, s.cfg.RetryMax)
			s.log.Warn("cdc publish failed; retrying the same events", slog.Int("events", len(ids)), slog.Any("error", err), slog.Duration("retry_in", d))
			if err := s.wait(ctx, d); err != nil {
				return err
			}
			continue
		}
		if !res.Unavailable {
			break
		}
		s.st.outages.Add(1)
		s.log.Warn("destination unavailable; keeping the slot's position and retrying the same events",
			slog.Int("events", len(ids)), slog.Duration("retry_in", res.RetryIn))
		if err := s.wait(ctx, res.RetryIn); err != nil {
			return err
		}
	}
	s.st.published.Add(int64(res.Published))
	missing := make(map[uuid.UUID]bool, len(res.Missing))
	for _, id := range res.Missing {
		missing[id] = true
	}
	now, gaveUp, kept := time.Now(), 0, 0
	for _, p := range batch {
		if missing[p.id] {
			if p.since.IsZero() {
				p.since = now
			}
			if now.Sub(p.since) < missingFor {
				s.waiting = append(s.waiting, p)
				kept++
				continue
			}
			gaveUp++
		}
		p.tx.open--
	}
	s.st.left.Add(int64(res.Left - kept))
	if gaveUp > 0 {
		s.log.Warn("events read from the WAL are not in the table; leaving them to the polling path", slog.Int("events", gaveUp))
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
func jitter(n int, min, max time.Duration) time.Duration { return backoff.Jittered(n, min, max) }
