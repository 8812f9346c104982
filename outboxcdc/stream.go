package outboxcdc

// The stream's reader: one replication connection reading the slot,
// decoding the outbox table's committed inserts in commit order, queueing
// their ids for the publisher (publisher.go) and confirming the slot's
// position behind what the publisher finished. It never waits for a
// publish: it reads, answers the server and confirms, whatever the
// publisher does.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/failpoint"
)

// errRewind ends a session whose queue was full once everything queued
// before the first transaction it did not queue is finished and confirmed:
// the next session reads that transaction again.
var errRewind = errors.New("outboxcdc: queue was full; reading the deferred transactions again")

// relation is what the reader needs of a relation of the stream: for the
// outbox table, the positions of the columns it reads.
type relation struct {
	outbox             bool
	id, aggType, aggID int
	aggTypeOK, aggIDOK bool
}

// stream is one streaming session of the slot: the reader, run by one
// goroutine, and the feed it shares with the publisher.
type stream struct {
	cfg  Config
	conn *pgconn.PgConn
	log  *slog.Logger
	st   *Stats
	f    *feed

	rels  map[uint32]relation
	inTx  bool
	txIDs []pendingID // the ids of the transaction being received
	// deferred counts the ids read and not queued (the queue was full).
	deferred int64

	confirmed               pglogrepl.LSN // reported to PostgreSQL as flushed
	nextConfirm, nextStatus time.Time
}

// run reads the stream until ctx ends or the connection fails, or returns
// errRewind (see feed.deferring).
func (s *stream) run(ctx context.Context) error {
	s.nextStatus = time.Now().Add(s.cfg.StatusInterval)
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		busy, rewind := s.f.outstanding()
		if err := s.confirm(); err != nil {
			return err
		}
		if rewind {
			if lsn, _ := s.f.confirmable(); lsn <= s.confirmed {
				return errRewind
			}
		}
		deadline := s.nextStatus
		if busy || rewind {
			// Look again soon at what the publisher finished.
			deadline = minTime(deadline, time.Now().Add(confirmInterval))
		}
		if lsn, _ := s.f.confirmable(); lsn > s.confirmed {
			deadline = minTime(deadline, s.nextConfirm)
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
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

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
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
		// With no transaction open and nothing unfinished, everything the
		// server decoded up to ServerWALEnd was received and finished (the
		// keepalive follows the data on the connection), so the slot may
		// move there: it stops holding WAL written by other tables.
		if !s.inTx {
			s.f.keepalive(pglogrepl.LSN(k.ServerWALEnd))
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
		rel := relation{}
		if m.Namespace == s.cfg.Schema && m.RelationName == "outbox_events" {
			rel = relation{outbox: true, id: -1}
			for i, c := range m.Columns {
				switch c.Name {
				case "event_id":
					rel.id = i
				case "aggregate_type":
					rel.aggType, rel.aggTypeOK = i, true
				case "aggregate_id":
					rel.aggID, rel.aggIDOK = i, true
				}
			}
			if rel.id < 0 {
				return fmt.Errorf("relation %s.outbox_events in the stream has no event_id column", m.Namespace)
			}
		}
		s.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		s.inTx, s.txIDs = true, s.txIDs[:0]
	case *pglogrepl.InsertMessage:
		rel, ok := s.rels[m.RelationID]
		if !ok {
			return fmt.Errorf("insert into relation %d before its description", m.RelationID)
		}
		if !rel.outbox || m.Tuple == nil {
			return nil
		}
		cols := m.Tuple.Columns
		if rel.id >= len(cols) || cols[rel.id].DataType != pglogrepl.TupleDataTypeText {
			return errors.New("an outbox insert in the stream carries no event_id in text form")
		}
		id, err := uuid.ParseBytes(cols[rel.id].Data)
		if err != nil {
			return fmt.Errorf("event_id in the stream: %w", err)
		}
		s.txIDs = append(s.txIDs, pendingID{id: id, lane: lane(rel, cols)})
	case *pglogrepl.CommitMessage:
		if len(s.txIDs) > 0 {
			s.st.received.Add(int64(len(s.txIDs)))
		}
		if !s.f.commit(m.TransactionEndLSN, s.txIDs, time.Now(), m.CommitTime) {
			s.deferred += int64(len(s.txIDs))
			s.st.deferred.Add(int64(len(s.txIDs)))
		}
		s.inTx, s.txIDs = false, nil
		s.st.queued.Store(int64(s.f.heldCount()))
	}
	return nil
}

// lane is the key of an inserted event's aggregate, "" when the insert
// does not carry it in text form.
func lane(rel relation, cols []*pglogrepl.TupleDataColumn) string {
	if !rel.aggTypeOK || !rel.aggIDOK || rel.aggType >= len(cols) || rel.aggID >= len(cols) {
		return ""
	}
	t, a := cols[rel.aggType], cols[rel.aggID]
	if t.DataType != pglogrepl.TupleDataTypeText || a.DataType != pglogrepl.TupleDataTypeText {
		return ""
	}
	return string(t.Data) + "\x00" + string(a.Data)
}

// confirm reports the confirmable position (see feed.confirmable) to
// PostgreSQL as flushed when it moved and confirmInterval passed since the
// last confirmation.
func (s *stream) confirm() error {
	lsn, events := s.f.confirmable()
	if lsn <= s.confirmed || time.Now().Before(s.nextConfirm) {
		return nil
	}
	if events > s.confirmed {
		if err := failpoint.Hit("cdc/before-confirm"); err != nil {
			return err
		}
	}
	s.confirmed = lsn
	s.nextConfirm = time.Now().Add(confirmInterval)
	return s.sendStatus(false)
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
