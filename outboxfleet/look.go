package outboxfleet

// The look: once per PollInterval, one statement per database asks, for
// every idle source at once, whether it holds an event a claim would take
// now, and wakes the relays of those that do. It replaces the idle relays'
// own polls (they back off to IdleMax, see outbox.RelayConfig.IdleBackoffMax),
// so that an event written without a wake-up (a writer that does not
// notify, a NOTIFY lost while the listener reconnected) goes out within
// PollInterval, at the price of one statement per database per interval
// however many sources are idle.
//
// A source is idle when its relay has not claimed for PollInterval and its
// last claim found nothing. A source whose last claim found events (or had
// more to read at once, outbox.ClaimObservation.More) is busy, however long
// its claims and publishes take (a claim over a large backlog takes seconds
// on a loaded server): its relay claims again as soon as it has published
// that batch, and finds what the look would, so the look leaves it out. Looking at it anyway cost a statement over its whole
// backlog every interval (an EXISTS over 180,000 pending rows took 0.8 to
// 3.3 s in TestFleetFigureIsolation), for nothing. A source that has not
// completed a claim since it started, or since the look woke it, is left
// out too: its relay's claim is on its way (a wake more would change
// nothing). Each of these holds at most IdleMax, after which the source is
// looked at again in any case.
//
// The look counts only a due event that heads its lane, so a lane whose
// head backs off after a failure (its successors due but not claimable) does
// not make it wake the source every time, nor slow the look for the
// source's other lanes. A source the look woke whose claims then found
// nothing anyway (a lane the claim leaves for another reason) is looked at
// less often, the wait doubling up to IdleMax, until a claim finds an event
// again.
//
// The look runs on a connection of its own (beside the pool and the
// listener), not one of the pool's: a slow look (a large table, a lock)
// then never holds a connection that a source's claim waits for.
//
// The look waits at most lookLockTimeout for a table's lock: a tenant's
// outbox_events locked by an upgrade (ALTER TABLE, pg_repack) must not
// stall the look for every other tenant. When the look times out, each
// source is looked at on its own; a source whose table is locked is woken
// (its relay's claim waits for the lock, as it would alone) and, its claims
// finding nothing meanwhile, is left out of the looks for longer each time,
// as above.

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgident"
)

func (d *database) lookLoop(ctx context.Context) {
	every := d.f.set.PollInterval
	t := time.NewTicker(every)
	defer t.Stop()
	conn := &lookConn{cfg: d.pool.Config().ConnConfig}
	defer conn.close()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := d.look(ctx, conn)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errSchemaGone):
			select {
			case d.rediscover <- struct{}{}:
			default:
			}
		case err != nil && !failing:
			failing = true
			d.log().Warn("look for due events in idle sources failed (retrying every poll interval)", slog.Any("error", err))
		case err == nil:
			failing = false
		}
	}
}

// lookConn is the look's connection, made when a look first needs it and
// again after it failed.
type lookConn struct {
	cfg  *pgx.ConnConfig
	conn *pgx.Conn
}

func (c *lookConn) get(ctx context.Context) (*pgx.Conn, error) {
	if c.conn != nil && !c.conn.IsClosed() {
		return c.conn, nil
	}
	c.close()
	conn, err := pgx.ConnectConfig(ctx, c.cfg.Copy())
	if err != nil {
		return nil, err
	}
	c.conn = conn
	return conn, nil
}

// failed drops the connection after err, unless err is the server's
// answer on a connection still open.
func (c *lookConn) failed(err error) {
	var pgErr *pgconn.PgError
	if c.conn != nil && (c.conn.IsClosed() || !errors.As(err, &pgErr)) {
		c.close()
	}
}

func (c *lookConn) close() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.conn.Close(ctx)
	c.conn = nil
}

// look runs one look over the idle sources due for one.
func (d *database) look(ctx context.Context, conn *lookConn) error {
	now := time.Now()
	due := d.dueForLook(now)
	if len(due) == 0 {
		return nil
	}
	c, err := conn.get(ctx)
	if err != nil {
		return err
	}
	found, err := d.lookSQL(ctx, c, due)
	if err != nil {
		conn.failed(err)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
			return errSchemaGone
		}
		return err
	}
	poll, limit := d.f.set.PollInterval, d.f.set.IdleMax
	for i, s := range due {
		if !found[i] {
			s.lookEvery = poll
			s.nextLook = time.Time{}
			continue
		}
		// Woken before, and no claim found an event since: the due events
		// are not claimable yet; look less often.
		_, _, foundAt := s.obs.lastClaim()
		if !s.wokeAt.IsZero() && foundAt.Before(s.wokeAt) {
			s.lookEvery = min(2*s.lookEvery, max(limit, poll))
		} else {
			s.lookEvery = poll
		}
		s.wokeAt = now
		s.nextLook = now.Add(s.lookEvery)
		s.relay.Wake()
	}
	return nil
}

// dueForLook returns the running sources that the look at now is to ask
// about: those idle (their relay has not claimed for PollInterval, and its
// last claim found nothing), not waiting for a claim (since their start or
// since the look woke them), and not backing off (nextLook). A source
// leaves the look for being busy or waiting for a claim for at most
// IdleMax.
func (d *database) dueForLook(now time.Time) []*source {
	poll := d.f.set.PollInterval
	hold := max(d.f.set.IdleMax, poll)
	var due []*source
	for _, s := range d.running() {
		if s.lookEvery == 0 {
			s.lookEvery = poll
		}
		claimAt, busy, _ := s.obs.lastClaim()
		waitingSince := s.started
		if s.wokeAt.After(waitingSince) {
			waitingSince = s.wokeAt
		}
		switch {
		case now.Sub(claimAt) < poll:
			// Claimed lately: it claims on its own.
		case busy && now.Sub(claimAt) < hold:
			// Busy: its relay claims again once it has published what
			// its last claim found (or at once, the claim having more to
			// read).
		case claimAt.Before(waitingSince) && now.Sub(waitingSince) < hold:
			// Started or woken, and no claim completed since: its claim
			// is on its way.
		case now.Before(s.nextLook):
		default:
			due = append(due, s)
		}
	}
	return due
}

// lookLockTimeout is how long a look waits for a lock on a table.
const lookLockTimeout = 100 * time.Millisecond

// lookSQL asks which of the sources hold an event a claim would take now,
// in one statement; when a locked table makes it time out, source by
// source, counting a locked one as holding one (so that it is woken).
func (d *database) lookSQL(ctx context.Context, conn *pgx.Conn, sources []*source) ([]bool, error) {
	found, err := d.lookStatement(ctx, conn, sources)
	if !lockTimedOut(err) {
		return found, err
	}
	found = make([]bool, len(sources))
	for i, s := range sources {
		one, err := d.lookStatement(ctx, conn, []*source{s})
		switch {
		case lockTimedOut(err):
			found[i] = true
		case err != nil:
			return nil, err
		default:
			found[i] = one[0]
		}
	}
	return found, nil
}

// lockTimedOut reports whether err is PostgreSQL's lock_timeout.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// lookStatement is the one statement of a look over sources: a due event
// that heads its lane (relay_sql.go's claimable and isHead), so that the
// due successors of a lane whose head backs off do not count, waiting at
// most lookLockTimeout for a lock.
func (d *database) lookStatement(ctx context.Context, conn *pgx.Conn, sources []*source) ([]bool, error) {
	var b strings.Builder
	for i, s := range sources {
		if i > 0 {
			b.WriteString("\nUNION ALL ")
		}
		sch, err := pgident.NewSchema(s.schema)
		if err != nil {
			return nil, err
		}
		events := sch.Table("outbox_events")
		b.WriteString("SELECT " + strconv.Itoa(i) + " WHERE EXISTS (SELECT 1 FROM " + events + ` e
	WHERE e.published_at IS NULL AND e.quarantined_at IS NULL AND e.available_at <= now()
	  AND (e.claim_until IS NULL OR e.claim_until < now())
	  AND NOT EXISTS (SELECT 1 FROM (SELECT p.published_at FROM ` + events + ` p
		WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id
		  AND p.aggregate_sequence = e.aggregate_sequence - 1 OFFSET 0) p
		WHERE p.published_at IS NULL OFFSET 0))`)
	}
	// The simple protocol: the statement changes with the set of idle
	// sources, and preparing each would cost a round trip and a cache entry.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(lookLockTimeout.Milliseconds(), 10),
		pgx.QueryExecModeSimpleProtocol); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, b.String(), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, err
	}
	found := make([]bool, len(sources))
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			rows.Close()
			return nil, err
		}
		found[i] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return found, tx.Commit(ctx)
}
