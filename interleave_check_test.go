package outbox_test

// The end of a schedule: the faults stop, the operator heals what the
// harness broke, liveness is awaited, the consumer drains, and I1-I5 (with
// the consumer's side of I4 and I5) are checked.

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/chaos"
)

// ilvConsumer is a consumer with several workers over the inbox. Each
// worker takes a delivery and handles it later, so workers race as they do
// in production; Early deliveries are redelivered.
type ilvConsumer struct {
	in          *inbox.Inbox
	joined      bool
	preexisting map[string]bool // aggregates with committed events when it joined
	held        []*outbox.Message
	paused      []*ilvPaused     // workers paused in their charge
	queue       []outbox.Message // redeliveries, before new messages
	delivered   map[string]bool  // places (ilvMsg.key) at the destination delivered
	handled     []outbox.Message
	floors      map[string]int64 // per aggregate, seeded or resolved up to
}

func (c *ilvConsumer) floor(agg string, to int64) {
	if c.floors == nil {
		c.floors = map[string]int64{}
	}
	c.floors[agg] = max(c.floors[agg], to)
}

// take hands worker i its next delivery, if it holds none: a
// redelivery first, else the next message at the destination.
func (c *ilvConsumer) take(w *world, i int) error {
	if c.held[i] != nil {
		return nil
	}
	if len(c.queue) > 0 {
		m := c.queue[0]
		c.queue = c.queue[1:]
		c.held[i] = &m
		return nil
	}
	m, err := c.nextNew(w)
	c.held[i] = m
	return err
}

// nextNew returns the next message at the destination not delivered yet,
// or nil.
func (c *ilvConsumer) nextNew(w *world) (*outbox.Message, error) {
	msgs := w.dest.cached()
	if len(c.delivered) >= len(msgs) {
		var err error
		if msgs, err = w.dest.messages(w.ctx); err != nil {
			return nil, err
		}
	}
	for _, x := range msgs {
		if !c.delivered[x.key] {
			c.delivered[x.key] = true
			m := x.m
			return &m, nil
		}
	}
	return nil, nil
}

// handle makes worker i handle what it holds.
func (c *ilvConsumer) handle(w *world, i int) error {
	m := c.held[i]
	if m == nil {
		return nil
	}
	c.held[i] = nil
	return c.handleMsg(w, m)
}

// handleMsg hands m to the inbox: it applies it (the effect is a row in
// ilv_effects, in the inbox's transaction) or answers duplicate, or early
// (redelivered later).
func (c *ilvConsumer) handleMsg(w *world, m *outbox.Message) error {
	if ok, err := c.pay(w, m); !ok || err != nil {
		if err == nil {
			c.queue = append(c.queue, *m)
		}
		return err
	}
	out, err := c.in.Handle(w.ctx, *m, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+w.env.schema+`.ilv_effects (event_id, aggregate_id, seq) VALUES ($1, $2, $3)`, m.ID, m.AggregateID, m.Sequence)
		return err
	})
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if out == inbox.Early {
		c.queue = append(c.queue, *m)
		return nil
	}
	c.handled = append(c.handled, *m)
	return nil
}

// drain delivers and handles everything at the destination until nothing
// moves: held deliveries first, then every new message, then each
// redelivery once, again while anything was applied.
func (c *ilvConsumer) drain(w *world) error {
	c.joined = true
	for i := range c.paused {
		if err := c.resume(w, i); err != nil {
			return err
		}
	}
	for i := range c.held {
		if err := c.handle(w, i); err != nil {
			return err
		}
	}
	for range 100 {
		before := len(c.handled)
		for {
			m, err := c.nextNew(w)
			if err != nil {
				return err
			}
			if m == nil {
				break
			}
			if err := c.handleMsg(w, m); err != nil {
				return err
			}
		}
		q := c.queue
		c.queue = nil
		for i := range q {
			if err := c.handleMsg(w, &q[i]); err != nil {
				return err
			}
		}
		if len(c.handled) == before {
			return nil
		}
	}
	return nil
}

// ilvMsg is a message at the destination; key identifies its place there.
type ilvMsg struct {
	key string
	m   outbox.Message
}

// ilvRow is an event's row as the checks read it.
type ilvRow struct {
	id                                      uuid.UUID
	agg                                     string
	seq                                     int64
	published, skipped, quarantined, leased bool
	attempts                                int
	lastError                               string
	dueIn                                   time.Duration // available_at - now()
	leaseLeft                               time.Duration // claim_until - now()
}

func (w *world) rows() (map[uuid.UUID]*ilvRow, error) {
	rows, err := w.env.app.Query(w.ctx, `SELECT event_id, aggregate_id, aggregate_sequence, published_at IS NOT NULL, skipped_at IS NOT NULL,
	quarantined_at IS NOT NULL, coalesce(claim_until > now(), false), attempt_count, coalesce(last_error, ''),
	CASE WHEN available_at = 'infinity' THEN 1e9 ELSE extract(epoch FROM available_at - now()) END,
	coalesce(extract(epoch FROM claim_until - now()), 0)
FROM `+w.env.schema+`.outbox_events`)
	if err != nil {
		return nil, err
	}
	out := map[uuid.UUID]*ilvRow{}
	var r ilvRow
	var due, lease float64
	_, err = pgx.ForEachRow(rows, []any{&r.id, &r.agg, &r.seq, &r.published, &r.skipped, &r.quarantined, &r.leased, &r.attempts, &r.lastError, &due, &lease}, func() error {
		x := r
		x.dueIn = time.Duration(due * float64(time.Second))
		x.leaseLeft = time.Duration(lease * float64(time.Second))
		out[x.id] = &x
		return nil
	})
	return out, err
}

// excused reports whether committed event ev may stay unpublished: it is
// poison (its destination or the relay cannot take it), or it waits behind
// an unpublished poison event of its lane, or behind an event the harness
// made fail that is still quarantined (the operator's retry of it could not
// run: an application's transaction held the lane).
func (w *world) excused(ev *ilvEvent, rows map[uuid.UUID]*ilvRow) string {
	for _, o := range w.events {
		if o.agg != ev.agg || o.seq > ev.seq {
			continue
		}
		r := rows[o.id]
		if r == nil || r.published {
			continue
		}
		switch {
		case o.poison != "":
			return fmt.Sprintf("behind %s event #%d", o.poison, o.seq)
		case r.quarantined && w.wasInjected(o.id):
			return fmt.Sprintf("behind #%d, which the harness failed and is still quarantined", o.seq)
		}
	}
	return ""
}

// heal is the operator after the faults: the events the harness made fail
// and that are quarantined are retried, poison ones skipped.
func (w *world) heal() error {
	qs, err := w.quarantined()
	if err != nil {
		return err
	}
	for _, ev := range qs {
		switch {
		case ev.poison != "":
			if err := w.operate("skip", ev.id, "ilv heal: "+ev.poison); err != nil {
				return err
			}
		case w.wasInjected(ev.id):
			if err := w.operate("retry", ev.id, "ilv heal"); err != nil {
				return err
			}
		}
	}
	w.wake()
	return nil
}

// stopFaults ends the schedule's faults: the destination is up, the
// database's clock flows, the relays run freely.
func (w *world) stopFaults() error {
	if err := (outageStep{}).run(w); err != nil {
		return err
	}
	if !w.clockFlows {
		w.clockFlows = true
		if _, err := w.env.app.Exec(w.ctx, `UPDATE `+w.env.clock+`.clock SET t = t + (pg_catalog.now() - since) * `+ilvCreep+`, flowing = true, since = pg_catalog.now()`); err != nil {
			return err
		}
	}
	for _, g := range w.relays {
		select {
		case <-g.freed:
		default:
			close(g.freed)
		}
		g.at = gateNone
	}
	w.wake()
	return nil
}

// awaitLiveness checks that every committed event that is not excused is
// published within ilvSlack of now, plus its own retry backoff (what its
// attempts earned it): an outage, a wake-up or an application's
// transaction must not hold it longer. An event is late only once every
// running relay has also made ilvSlackRounds claims since now (or
// ilvSlackCap has passed beyond its bound): see ilvSlack.
func (w *world) awaitLiveness(phase string) error {
	start := time.Now()
	claimsAt := map[*ilvRelay]int64{}
	for _, g := range w.relays {
		claimsAt[g] = g.claims.Load()
	}
	// rounds reports whether every relay still running has made
	// ilvSlackRounds claims since start.
	rounds := func() bool {
		for _, g := range w.relays {
			if !g.exited && g.claims.Load()-claimsAt[g] < ilvSlackRounds {
				return false
			}
		}
		return true
	}
	rows, err := w.rows()
	if err != nil {
		return err
	}
	deadline := map[uuid.UUID]time.Time{}
	bound := map[uuid.UUID]time.Duration{}
	if os.Getenv("ILV_DEBUG") != "" {
		for _, ev := range w.events {
			if r := rows[ev.id]; r != nil && !r.published {
				fmt.Printf("debug: liveness %s: %s %s\n", phase, ev.name(), r.state())
			}
		}
	}
	laneWait := map[string]time.Duration{} // the longest wait of an earlier unpublished event of the lane
	byLane := append([]*ilvEvent(nil), w.events...)
	sort.SliceStable(byLane, func(i, j int) bool { return byLane[i].seq < byLane[j].seq })
	for _, ev := range byLane {
		if r := rows[ev.id]; r != nil && !r.published {
			wait := laneWait[ev.agg]
			if r.attempts > 0 {
				wait = max(wait, min(ilvBackoffMax, ilvBackoffMin<<min(r.attempts-1, 20))) // its own retry backoff
			}
			if until, ok := w.stepLeases[ev.id]; ok {
				// A lease taken before the faults stopped, which a lost
				// settle leaves to expire.
				wait = max(wait, until.Sub(start))
			}
			laneWait[ev.agg] = wait // the events behind it wait for it too
			// A relay that met an outage looks at the destination again
			// within ilvProbeMax, and publishes at once when it is back:
			// an outage spends no attempt and pushes no event's
			// available_at, so however long it lasted, it adds no more.
			bound[ev.id] = ilvSlack + wait + ilvProbeMax
			deadline[ev.id] = start.Add(bound[ev.id])
		}
	}
	for {
		rows, err = w.rows()
		if err != nil {
			return err
		}
		// A relay waiting on an application's open transaction: nothing
		// it holds moves until that transaction ends, however long.
		blocked := false
		for _, g := range w.relays {
			if why := w.lockWait(g.app); why != "" {
				w.violate("liveness", "%s: relay %s is blocked: %s", phase, g.name, why)
				blocked = true
			}
		}
		if blocked {
			return nil
		}
		var late []*ilvEvent
		waiting := false
		for _, ev := range w.events {
			d, ok := deadline[ev.id]
			r := rows[ev.id]
			if !ok || r == nil || r.published || w.excused(ev, rows) != "" {
				continue
			}
			switch {
			case time.Now().After(d) && (rounds() || time.Now().After(d.Add(ilvSlackCap))):
				late = append(late, ev)
			case r.quarantined || (r.dueIn > 0 && time.Now().Add(r.dueIn).After(d)):
				// It cannot be published in time: a quarantine waits for
				// an operator, and nothing claims an event before it is
				// due.
				late = append(late, ev)
				deadline[ev.id] = time.Now()
			default:
				waiting = true
			}
		}
		if !waiting {
			for _, ev := range late {
				r := rows[ev.id]
				w.violate("liveness", "%s: %s not published within %s of the faults' end and %d claims of each relay (%s)", phase, ev.name(), bound[ev.id].Round(time.Millisecond), ilvSlackRounds, r.state())
			}
			return nil
		}
		time.Sleep(5 * time.Millisecond) // polling the table for the relays' progress, not ordering anything
	}
}

func (ev *ilvEvent) name() string { return fmt.Sprintf("event %s#%d", ilvAggName(ev.agg), ev.seq) }

func (r *ilvRow) state() string {
	switch {
	case r.quarantined:
		return fmt.Sprintf("quarantined after %d attempts: %s", r.attempts, r.lastError)
	case r.leased:
		return fmt.Sprintf("leased for %s more", r.leaseLeft.Round(time.Millisecond))
	case r.dueIn > 0:
		return fmt.Sprintf("due in %s, %d attempts spent", r.dueIn.Round(time.Millisecond), r.attempts)
	}
	return fmt.Sprintf("due, %d attempts spent", r.attempts)
}

// finish ends a schedule: faults stop, heal, liveness with the open writers
// still open, then committed, liveness again, the consumer drains, checks.
func (w *world) finish() error {
	rows, err := w.rows()
	if err != nil {
		return err
	}
	w.checkAttempts(rows)
	now := time.Now()
	w.stepLeases = map[uuid.UUID]time.Time{}
	for id, r := range rows {
		if r.leased {
			w.stepLeases[id] = now.Add(r.leaseLeft)
		}
	}
	if err := w.stopFaults(); err != nil {
		return err
	}
	if err := w.heal(); err != nil {
		return err
	}
	t := time.Now()
	if err := w.awaitLiveness("with the open transactions open"); err != nil {
		return err
	}
	ilvPhases.add("end: liveness", t)
	names := make([]string, 0, len(w.writers))
	for n := range w.writers {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 0 || w.pin != nil {
		for _, n := range names {
			if err := (endStep{w: n, commit: true}).run(w); err != nil {
				return err
			}
		}
		if err := (pinStep{}).run(w); err != nil {
			return err
		}
		if err := w.heal(); err != nil {
			return err
		}
		t := time.Now()
		if err := w.awaitLiveness("once they committed"); err != nil {
			return err
		}
		ilvPhases.add("end: liveness after commit", t)
	}
	t = time.Now()
	if err := w.consumer.drain(w); err != nil {
		return err
	}
	ilvPhases.add("end: drain", t)
	defer ilvPhases.add("end: check", time.Now())
	return w.check()
}

// check verifies I1-I5 on the final state against what the harness did.
func (w *world) check() error {
	rows, err := w.rows()
	if err != nil {
		return err
	}
	all, err := w.dest.messages(w.ctx)
	if err != nil {
		return err
	}
	msgs := make([]outbox.Message, len(all))
	for i, m := range all {
		msgs[i] = m.m
	}
	skipped := map[[2]any]bool{}
	for _, ev := range w.events {
		if r := rows[ev.id]; w.skipped[ev.id] || (r != nil && r.skipped) {
			skipped[[2]any{ev.agg, ev.seq}] = true
		}
	}
	atDest := chaos.DeliveryOrder(msgs, func(_, agg string, seq int64) bool { return skipped[[2]any{agg, seq}] }, w.violate)
	for _, m := range msgs {
		if w.byID[m.ID] == nil {
			w.violate("I2", "message %s (%s#%d) at the destination was never committed (rolled back: %v)", m.ID, ilvAggName(m.AggregateID), m.Sequence, w.rolledBack[m.ID])
		}
	}
	for id := range rows {
		if w.byID[id] == nil {
			w.violate("I2", "event %s in the table was never committed (rolled back: %v)", id, w.rolledBack[id])
		}
	}
	for _, ev := range w.events {
		r := rows[ev.id]
		isSkipped := skipped[[2]any{ev.agg, ev.seq}]
		if r == nil && atDest[ev.id] == 0 && !isSkipped {
			w.violate("I1", "%s: committed, gone from the table and never at the destination", ev.name())
		}
		if isSkipped || atDest[ev.id] > 0 {
			continue
		}
		if why := w.excused(ev, rows); why != "" {
			continue
		}
		state := "gone from the table"
		if r != nil {
			state = r.state()
		}
		if r != nil && r.quarantined && !w.wasInjected(ev.id) {
			w.violate("I3", "%s is quarantined although nothing refused it: %s", ev.name(), r.lastError)
			continue
		}
		w.violate("I3", "%s never reached the destination (%s)", ev.name(), state)
	}
	if os.Getenv("ILV_DEBUG") != "" {
		for _, ev := range w.events {
			if r := rows[ev.id]; r != nil {
				fmt.Printf("debug: %s poison=%q published=%v skipped=%v %s at-dest=%d\n", ev.name(), ev.poison, r.published, r.skipped, r.state(), atDest[ev.id])
			}
		}
		for _, t := range w.trace {
			fmt.Println("debug:", t)
		}
	}
	w.checkAttempts(rows)
	if err := w.checkCharges(); err != nil {
		return err
	}
	return w.checkConsumer(rows, atDest, skipped)
}

// checkAttempts: an event's attempt_count counts its own failures only. An
// outage (every publish refused as unavailable, an unavailable message
// alone in its batch, a lost ack) is the destination's state and spends
// none (issue 19, item 7), so no event has more attempts than the failures
// the harness gave it that may count: its "retry" and "perm" outcomes, and
// its "unavail" and "lostack" ones (blamed on it after LoneOutageLimit in a
// row while others were published). Poison events fail on their own.
func (w *world) checkAttempts(rows map[uuid.UUID]*ilvRow) {
	for _, ev := range w.events {
		r := rows[ev.id]
		if r == nil || ev.poison != "" || w.attemptsReported[ev.id] {
			continue
		}
		if n := w.failures(ev.id); r.attempts > n {
			w.attemptsReported[ev.id] = true
			w.violate("liveness", "%s has %d attempts spent but was failed only %d times: an outage spent an attempt (%s)", ev.name(), r.attempts, n, r.state())
		}
	}
}

// checkConsumer checks the consumer's side: each event applied at most
// once (I4), in sequence order per aggregate (I5), and every event that
// reached the destination applied, unless the consumer was told it need
// not be (a seed, a resolve, or an aggregate it joined mid-way with
// StartAtFirstSeen).
func (w *world) checkConsumer(rows map[uuid.UUID]*ilvRow, atDest map[uuid.UUID]int, skipped map[[2]any]bool) error {
	rs, err := w.env.app.Query(w.ctx, `SELECT event_id, aggregate_id, seq FROM `+w.env.schema+`.ilv_effects ORDER BY n`)
	if err != nil {
		return err
	}
	applied := map[uuid.UUID]int{}
	last := map[string]int64{}
	first := map[string]int64{}
	var id uuid.UUID
	var agg string
	var seq int64
	if _, err := pgx.ForEachRow(rs, []any{&id, &agg, &seq}, func() error {
		applied[id]++
		if applied[id] == 2 {
			w.violate("I4", "event %s#%d applied twice", ilvAggName(agg), seq)
		}
		if seq <= last[agg] {
			w.violate("I5", "the consumer applied %s#%d after #%d", ilvAggName(agg), seq, last[agg])
		}
		if _, ok := first[agg]; !ok {
			first[agg] = seq
		}
		last[agg] = max(last[agg], seq)
		return nil
	}); err != nil {
		return err
	}
	c := w.consumer
	for _, ev := range w.events {
		if atDest[ev.id] == 0 || applied[ev.id] > 0 || skipped[[2]any{ev.agg, ev.seq}] || ev.seq <= c.floors[ev.agg] {
			continue
		}
		if w.cfg.firstSeen && c.preexisting[ev.agg] && (first[ev.agg] == 0 || ev.seq < first[ev.agg]) {
			continue // joined mid-way: history before the first event seen is not wanted
		}
		how := "new aggregate"
		if c.preexisting[ev.agg] {
			how = "aggregate older than the consumer"
		}
		w.violate("I4", "%s reached the destination but the consumer never applied it (%s, first-seen %v; applied of it: from #%d to #%d)",
			ev.name(), how, w.cfg.firstSeen, first[ev.agg], last[ev.agg])
	}
	return nil
}
