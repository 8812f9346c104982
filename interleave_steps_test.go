package outbox_test

// The step vocabulary of the interleaving search. A step is one small type:
// String (its line in a schedule), run (what it does to the world), and an
// entry in ilvKinds with its parser, its generator and its weight. Steps that
// make no sense when they come (a commit of a writer that is not open, a
// relay the schedule does not have: shrinking removes steps freely) do
// nothing.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
)

// ilvStep is one step of a schedule.
type ilvStep interface {
	String() string
	run(w *world) error
}

// ilvKind is a kind of step: its name (the first word of its line), how to
// read its arguments, how to draw one (nil: not now) and how often.
type ilvKind struct {
	name   string
	weight int
	parse  func(args []string) (ilvStep, error)
	gen    func(g *ilvGen) ilvStep
}

// ilvKinds is the vocabulary. Adding a step: a type with String and run,
// and one entry here.
var ilvKinds = []ilvKind{
	{"write", 14, parseWrite, genWrite},
	{"begin", 5, parseBegin, genBegin},
	{"commit", 5, parseEnd(true), genEnd(true)},
	{"rollback", 2, parseEnd(false), genEnd(false)},
	{"sqlrow", 4, parseSQLRow, genSQLRow},
	{"relay", 22, parseRelay, genRelay},
	{"pause", 3, parsePause, genPause},
	{"outage", 1, parseOutage, genOutage},
	{"tick", 6, parseTick, genTick},
	{"retry", 3, parseOperator("retry"), genOperator("retry")},
	{"skip", 3, parseOperator("skip"), genOperator("skip")},
	{"replay", 1, parseReplay, genReplay},
	{"cleanup", 1, parseNoArgs("cleanup", func() ilvStep { return cleanupStep{} }), func(*ilvGen) ilvStep { return cleanupStep{} }},
	{"sweep", 1, parseNoArgs("sweep", func() ilvStep { return sweepStep{} }), func(*ilvGen) ilvStep { return sweepStep{} }},
	{"join", 0, parseNoArgs("join", func() ilvStep { return joinStep{} }), nil},
	{"take", 8, parseWorker("take"), genWorker("take")},
	{"handle", 8, parseWorker("handle"), genWorker("handle")},
	{"redeliver", 2, parseRedeliver, genRedeliver},
	{"seed", 1, parseSeed, genSeed},
	{"resolve", 1, parseResolve, genResolve},
	{"killconn", 2, parseKillConn, genKillConn},
	{"pin", 1, parseNoArgs("pin", func() ilvStep { return pinStep{on: true} }), genPin},
	{"unpin", 0, parseNoArgs("unpin", func() ilvStep { return pinStep{} }), nil},
	{"resume", 3, parseResume, genResume},
	{"provider", 1, parseProvider, genProvider},
	{"wide", 3, parseWide, genWide},
}

// ilvAggs are the aggregates writers pick from: a few often (so that
// writers, relays and the operator meet on them), more now and then (so
// that new lanes keep coming), and L, the 500-byte id.
var ilvAggs = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}

// ilvGen draws steps, keeping just enough of a model to draw ones that
// make sense: which writers are open, whether the destination is down,
// which relays are paused.
type ilvGen struct {
	rng     *rand.Rand
	cfg     ilvConfig
	open    []string
	nextW   int
	outage  int // steps left in the outage
	paused  map[string]bool
	pinned  bool
	joined  bool
	written int
	fresh   int // new aggregates drawn
}

func (g *ilvGen) agg() string {
	switch x := g.rng.IntN(20); {
	case x == 0:
		return "L"
	case x < 10:
		return ilvAggs[g.rng.IntN(3)]
	case x < 14:
		return ilvAggs[g.rng.IntN(len(ilvAggs))]
	}
	return g.freshAgg()
}

// freshAgg is a new aggregate (an order created), as most writes of an
// order system are.
func (g *ilvGen) freshAgg() string {
	g.fresh++
	return fmt.Sprintf("n%d", g.fresh)
}

func (g *ilvGen) relayName() string { return fmt.Sprintf("r%d", 1+g.rng.IntN(g.cfg.relays)) }

// --- writers ---

// writeStep commits n events of an aggregate in a transaction of its own.
type writeStep struct {
	agg string
	n   int
	big bool
}

func (s writeStep) String() string { return fmt.Sprintf("write %s %d%s", s.agg, s.n, bigWord(s.big)) }

func bigWord(big bool) string {
	if big {
		return " big"
	}
	return ""
}

func (s writeStep) run(w *world) error {
	if w.heldBy(ilvAggID(s.agg), "") != "" {
		return nil // it would wait for that writer: writers of an aggregate serialise
	}
	tx, err := w.env.app.Begin(w.ctx)
	if err != nil {
		return err
	}
	evs, err := w.insert(tx, s.agg, s.n, s.big)
	if err != nil {
		_ = tx.Rollback(w.ctx)
		return err
	}
	if err := tx.Commit(w.ctx); err != nil {
		return err
	}
	w.commitEvents(evs)
	w.wake()
	return nil
}

// heldBy returns the open writer other than except holding aggregate agg
// (its counter row, until it ends), or "".
func (w *world) heldBy(agg, except string) string {
	for name, wr := range w.writers {
		if name == except {
			continue
		}
		for _, ev := range wr.events {
			if ev.agg == agg {
				return name
			}
		}
	}
	return ""
}

// insert writes n events of agg with the Writer in tx.
func (w *world) insert(tx pgx.Tx, agg string, n int, big bool) ([]*ilvEvent, error) {
	payload := []byte(`{"n":1}`)
	if big {
		payload = []byte(`{"pad":"` + ilvBigPad + `"}`)
	}
	var events []outbox.Event
	for range n {
		events = append(events, outbox.Event{AggregateType: ilvAggType, AggregateID: ilvAggID(agg), Type: "Changed", Payload: payload})
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	recs, err := w.env.writer.InsertTx(ctx, tx, events...)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", agg, err)
	}
	var out []*ilvEvent
	for _, r := range recs {
		out = append(out, &ilvEvent{id: r.ID, agg: ilvAggID(agg), seq: r.Sequence, big: big})
	}
	return out, nil
}

func parseWrite(a []string) (ilvStep, error) {
	if len(a) < 2 || len(a) > 3 {
		return nil, errors.New("want: write AGG N [big]")
	}
	n, err := strconv.Atoi(a[1])
	return writeStep{agg: a[0], n: n, big: len(a) == 3 && a[2] == "big"}, err
}

func genWrite(g *ilvGen) ilvStep {
	g.written++
	return writeStep{agg: g.agg(), n: 1 + g.rng.IntN(3)*g.rng.IntN(2), big: g.rng.IntN(10) == 0}
}

// wideStep commits one event of each of its aggregates in one
// transaction: a transaction wider than a claim's window (16 rows), whose
// lanes continue in the next wide transaction. The claims then fill their
// windows, leave heads for lack of room, and the relays set aside the lanes
// whose next event lies ahead of their cursor (claimCursor.ahead).
// Aggregates an open writer holds are left out (it would wait for them).
type wideStep struct{ aggs []string }

func (s wideStep) String() string { return "wide " + strings.Join(s.aggs, ",") }

func (s wideStep) run(w *world) error {
	var events []outbox.Event
	for _, a := range s.aggs {
		if w.heldBy(ilvAggID(a), "") != "" {
			continue
		}
		events = append(events, outbox.Event{AggregateType: ilvAggType, AggregateID: ilvAggID(a), Type: "Changed", Payload: []byte(`{"n":1}`)})
	}
	if len(events) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	var evs []*ilvEvent
	err := pgx.BeginFunc(ctx, w.env.app, func(tx pgx.Tx) error {
		recs, err := w.env.writer.InsertTx(ctx, tx, events...)
		if err != nil {
			return err
		}
		for i, r := range recs {
			evs = append(evs, &ilvEvent{id: r.ID, agg: events[i].AggregateID, seq: r.Sequence})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	w.commitEvents(evs)
	w.wake()
	return nil
}

func parseWide(a []string) (ilvStep, error) {
	if len(a) != 1 || a[0] == "" {
		return nil, errors.New("want: wide A,B,...")
	}
	return wideStep{aggs: strings.Split(a[0], ",")}, nil
}

// genWide draws a wide transaction over a pool of thirty aggregates that
// wide transactions share (and a few of the common ones), or, one time in
// three, a bulk write of one aggregate longer than a window.
func genWide(g *ilvGen) ilvStep {
	if g.rng.IntN(3) == 0 {
		g.written++
		return writeStep{agg: g.agg(), n: 17 + g.rng.IntN(24)}
	}
	pool := make([]string, 0, 33)
	for i := range 30 {
		pool = append(pool, fmt.Sprintf("w%d", i))
	}
	pool = append(pool, ilvAggs[:3]...)
	g.rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	g.written++
	return wideStep{aggs: pool[:17+g.rng.IntN(len(pool)-16)]}
}

// beginStep writes n events in writer transaction w, opening it first
// if needed; it stays open (across relay rounds) until commit or rollback.
type beginStep struct {
	w   string
	agg string
	n   int
	big bool
}

func (s beginStep) String() string {
	return fmt.Sprintf("begin %s %s %d%s", s.w, s.agg, s.n, bigWord(s.big))
}

func (s beginStep) run(w *world) error {
	if other := w.heldBy(ilvAggID(s.agg), s.w); other != "" {
		return nil // it would wait for writer other
	}
	wr := w.writers[s.w]
	if wr == nil {
		tx, err := w.env.app.Begin(w.ctx)
		if err != nil {
			return err
		}
		wr = &ilvWriter{tx: tx}
		w.writers[s.w] = wr
	}
	evs, err := w.insert(wr.tx, s.agg, s.n, s.big)
	if err != nil {
		return err
	}
	wr.events = append(wr.events, evs...)
	return nil
}

func parseBegin(a []string) (ilvStep, error) {
	if len(a) < 3 || len(a) > 4 {
		return nil, errors.New("want: begin W AGG N [big]")
	}
	n, err := strconv.Atoi(a[2])
	return beginStep{w: a[0], agg: a[1], n: n, big: len(a) == 4 && a[3] == "big"}, err
}

func genBegin(g *ilvGen) ilvStep {
	if len(g.open) >= 2 {
		return nil
	}
	g.nextW++
	name := fmt.Sprintf("w%d", g.nextW)
	g.open = append(g.open, name)
	return beginStep{w: name, agg: g.agg(), n: 1 + g.rng.IntN(2), big: g.rng.IntN(12) == 0}
}

// endStep commits or rolls back writer transaction w.
type endStep struct {
	w      string
	commit bool
}

func (s endStep) String() string {
	if s.commit {
		return "commit " + s.w
	}
	return "rollback " + s.w
}

func (s endStep) run(w *world) error {
	wr := w.writers[s.w]
	if wr == nil {
		return nil
	}
	delete(w.writers, s.w)
	if !s.commit {
		for _, ev := range wr.events {
			w.rolledBack[ev.id] = true
		}
		return wr.tx.Rollback(w.ctx)
	}
	if err := wr.tx.Commit(w.ctx); err != nil {
		return err
	}
	w.commitEvents(wr.events)
	w.wake()
	return nil
}

func parseEnd(commit bool) func([]string) (ilvStep, error) {
	return func(a []string) (ilvStep, error) {
		if len(a) != 1 {
			return nil, errors.New("want: commit|rollback W")
		}
		return endStep{w: a[0], commit: commit}, nil
	}
}

func genEnd(commit bool) func(*ilvGen) ilvStep {
	return func(g *ilvGen) ilvStep {
		if len(g.open) == 0 {
			return nil
		}
		i := g.rng.IntN(len(g.open))
		name := g.open[i]
		g.open = slices.Delete(g.open, i, i+1)
		return endStep{w: name, commit: commit}
	}
}

// sqlRowStep is a writer in another language inserting a row by hand:
// "undecodable" headers (JSON, but not an object of strings) or a "plain"
// row with a jsonb payload. It allocates the sequence as the writers do,
// but does not read the lane's parked flag.
type sqlRowStep struct {
	agg  string
	kind string
}

func (s sqlRowStep) String() string { return "sqlrow " + s.agg + " " + s.kind }

func (s sqlRowStep) run(w *world) error {
	if w.heldBy(ilvAggID(s.agg), "") != "" {
		return nil
	}
	headers := `{"source":"sql"}`
	if s.kind == "undecodable" {
		headers = `{"retries": 3}`
	}
	id := uuid.New()
	t := w.env.schema
	var seq int64
	err := pgx.BeginFunc(w.ctx, w.env.app, func(tx pgx.Tx) error {
		// The lane's next sequence as the SQL write API takes it (migration
		// 020: the counter row locked, then the lane's last event read),
		// through its internal function, which the tables' owner may call.
		if err := tx.QueryRow(w.ctx, `SELECT base + 1 FROM `+t+`.lane_bases(ARRAY[$1], ARRAY[$2], ARRAY[1])`,
			ilvAggType, ilvAggID(s.agg)).Scan(&seq); err != nil {
			return err
		}
		_, err := tx.Exec(w.ctx, `INSERT INTO `+t+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers, available_at)
VALUES ($1, $2, $3, $4, 'Changed', '{"n": 1}', $5::jsonb, now())`, id, ilvAggType, ilvAggID(s.agg), seq, headers)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	ev := &ilvEvent{id: id, agg: ilvAggID(s.agg), seq: seq}
	w.commitEvents([]*ilvEvent{ev})
	if s.kind == "undecodable" {
		ev.poison = "undecodable"
	}
	w.wake()
	return nil
}

func parseSQLRow(a []string) (ilvStep, error) {
	if len(a) != 2 || (a[1] != "undecodable" && a[1] != "plain") {
		return nil, errors.New("want: sqlrow AGG undecodable|plain")
	}
	return sqlRowStep{agg: a[0], kind: a[1]}, nil
}

func genSQLRow(g *ilvGen) ilvStep {
	kind := "plain"
	if g.rng.IntN(2) == 0 {
		kind = "undecodable"
	}
	return sqlRowStep{agg: g.agg(), kind: kind}
}

// --- relays ---

// ilvOutcomes are the per-message outcomes a relay step can plan.
var ilvOutcomes = []string{"perm", "retry", "unavail", "lostack"}

// relayStep lets a relay go to its next boundary: held after a claim, it
// publishes (message i of the round meeting plan[i], "ok" where the plan
// says nothing), settles, claims again and is held there; held inside a
// publish (pause), it goes on from there.
type relayStep struct {
	r    string
	plan map[int]string
}

func planString(p map[int]string) string {
	var keys []int
	for k := range p {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %d:%s", k, p[k])
	}
	return b.String()
}

func parseOutcomePlan(a []string) (map[int]string, error) {
	p := map[int]string{}
	for _, x := range a {
		i, o, ok := strings.Cut(x, ":")
		n, err := strconv.Atoi(i)
		if !ok || err != nil || !slices.Contains(ilvOutcomes, o) {
			return nil, fmt.Errorf("bad outcome %q (want I:%s)", x, strings.Join(ilvOutcomes, "|"))
		}
		p[n] = o
	}
	return p, nil
}

func genPlan(g *ilvGen) map[int]string {
	p := map[int]string{}
	if g.rng.IntN(3) == 0 {
		for range 1 + g.rng.IntN(2) {
			p[g.rng.IntN(4)] = ilvOutcomes[g.rng.IntN(len(ilvOutcomes))]
		}
	}
	return p
}

func (s relayStep) String() string { return "relay " + s.r + planString(s.plan) }

func (s relayStep) run(w *world) error {
	g := w.relay(s.r)
	if g == nil || g.stuck {
		return nil
	}
	if g.at == gateClaim {
		g.plan = s.plan
	}
	w.advance(g)
	return nil
}

func parseRelay(a []string) (ilvStep, error) {
	if len(a) < 1 {
		return nil, errors.New("want: relay R [I:OUTCOME...]")
	}
	p, err := parseOutcomePlan(a[1:])
	return relayStep{r: a[0], plan: p}, err
}

func genRelay(g *ilvGen) ilvStep {
	r := g.relayName()
	delete(g.paused, r)
	if g.outage > 0 {
		g.outage--
	}
	return relayStep{r: r, plan: genPlan(g)}
}

// pauseStep lets a relay held after a claim publish, and holds it again
// inside the publish: "before" the destination is called, or "after" it
// answered and before the outcome is recorded. A tick past the lease
// while it is held is a process paused past its lease.
type pauseStep struct {
	r     string
	after bool
	plan  map[int]string
}

func (s pauseStep) String() string {
	at := "before"
	if s.after {
		at = "after"
	}
	return "pause " + s.r + " " + at + planString(s.plan)
}

func (s pauseStep) run(w *world) error {
	g := w.relay(s.r)
	if g == nil || g.stuck || g.at != gateClaim {
		return nil
	}
	g.plan = s.plan
	g.pauseAt = gateBeforePublish
	if s.after {
		g.pauseAt = gateAfterAck
	}
	w.advance(g)
	g.pauseAt = gateNone // the claim was empty: it never published
	return nil
}

func parsePause(a []string) (ilvStep, error) {
	if len(a) < 2 || (a[1] != "before" && a[1] != "after") {
		return nil, errors.New("want: pause R before|after [I:OUTCOME...]")
	}
	p, err := parseOutcomePlan(a[2:])
	return pauseStep{r: a[0], after: a[1] == "after", plan: p}, err
}

func genPause(g *ilvGen) ilvStep {
	r := g.relayName()
	if g.paused[r] {
		return nil
	}
	g.paused[r] = true
	return pauseStep{r: r, after: g.rng.IntN(2) == 0, plan: genPlan(g)}
}

// outageStep takes the destination down (every publish fails as
// unavailable) or brings it back.
type outageStep struct{ on bool }

func (s outageStep) String() string {
	if s.on {
		return "outage on"
	}
	return "outage off"
}

func (s outageStep) run(w *world) error {
	w.outage.Store(s.on)
	return nil
}

func parseOutage(a []string) (ilvStep, error) {
	if len(a) != 1 || (a[0] != "on" && a[0] != "off") {
		return nil, errors.New("want: outage on|off")
	}
	return outageStep{on: a[0] == "on"}, nil
}

func genOutage(g *ilvGen) ilvStep {
	if g.outage > 0 {
		return nil
	}
	// Relay rounds until it ends: mostly a few, sometimes many (each
	// round of a relay that waits out the outage as it should costs real
	// time: its backoff).
	g.outage = 3 + g.rng.IntN(4)
	if g.rng.IntN(4) == 0 {
		g.outage = 9 + g.rng.IntN(4)
	}
	return outageStep{on: true}
}

// tickStep lets time pass in the database: backoffs end, leases expire.
type tickStep struct{ d time.Duration }

func (s tickStep) String() string { return "tick " + s.d.String() }

func (s tickStep) run(w *world) error { return w.tick(s.d) }

func parseTick(a []string) (ilvStep, error) {
	if len(a) != 1 {
		return nil, errors.New("want: tick DURATION")
	}
	d, err := time.ParseDuration(a[0])
	return tickStep{d: d}, err
}

func genTick(g *ilvGen) ilvStep {
	switch g.rng.IntN(4) {
	case 0:
		return tickStep{d: ilvLease + time.Second} // past every lease
	case 1:
		return tickStep{d: ilvBackoffMax}
	}
	return tickStep{d: time.Duration(1+g.rng.IntN(8)) * 50 * time.Millisecond}
}

// --- the operator ---

// operatorStep retries or skips the i-th quarantined event (by aggregate
// and sequence, modulo their number): any of them, a lane's head or not.
type operatorStep struct {
	action string
	i      int
}

func (s operatorStep) String() string { return fmt.Sprintf("%s %d", s.action, s.i) }

func (s operatorStep) run(w *world) error {
	qs, err := w.quarantined()
	if err != nil || len(qs) == 0 {
		return err
	}
	q := qs[s.i%len(qs)]
	return w.operate(s.action, q.id, "an operator's step")
}

// quarantined lists the quarantined events by aggregate and sequence.
func (w *world) quarantined() ([]*ilvEvent, error) {
	rows, err := w.env.app.Query(w.ctx, `SELECT event_id FROM `+w.env.schema+`.outbox_events
WHERE quarantined_at IS NOT NULL AND published_at IS NULL ORDER BY aggregate_id, aggregate_sequence`)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	var out []*ilvEvent
	for _, id := range ids {
		if ev := w.byID[id]; ev != nil {
			out = append(out, ev)
		}
	}
	return out, nil
}

// operate retries or skips event id as an operator does. An action that
// waits on a lock for a second (an application's open transaction holds
// the lane) is given up, as an operator would.
func (w *world) operate(action string, id uuid.UUID, why string) error {
	ctx, cancel := context.WithTimeout(w.ctx, time.Second)
	defer cancel()
	var err error
	if action == "skip" {
		_, err = w.env.admin.Skip(ctx, id, "ilv", why)
		if err == nil {
			w.skipped[id] = true
		}
	} else {
		_, err = w.env.admin.Retry(ctx, id, "ilv")
	}
	if err != nil {
		w.note("%s %s: %v", action, id, err)
	}
	return nil
}

func parseOperator(action string) func([]string) (ilvStep, error) {
	return func(a []string) (ilvStep, error) {
		if len(a) != 1 {
			return nil, fmt.Errorf("want: %s I", action)
		}
		i, err := strconv.Atoi(a[0])
		return operatorStep{action: action, i: i}, err
	}
}

func genOperator(action string) func(*ilvGen) ilvStep {
	return func(g *ilvGen) ilvStep { return operatorStep{action: action, i: g.rng.IntN(4)} }
}

// replayStep publishes an aggregate's published events again (Admin.Replay).
type replayStep struct{ agg string }

func (s replayStep) String() string { return "replay " + s.agg }

func (s replayStep) run(w *world) error {
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	_, err := w.env.admin.Replay(ctx, w.dest.publisher(), outbox.ReplayConfig{AggregateType: ilvAggType, AggregateID: ilvAggID(s.agg), By: "ilv", MaxAttempts: 1})
	if err != nil {
		w.note("%s: %v", s, err)
	}
	return nil
}

func parseReplay(a []string) (ilvStep, error) {
	if len(a) != 1 {
		return nil, errors.New("want: replay AGG")
	}
	return replayStep{agg: a[0]}, nil
}

func genReplay(g *ilvGen) ilvStep { return replayStep{agg: g.agg()} }

// cleanupStep deletes settled events and inbox rows older than a second
// (of the database's clock).
type cleanupStep struct{}

func (cleanupStep) String() string { return "cleanup" }

func (cleanupStep) run(w *world) error {
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	_, err := w.env.admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Second, InboxOlderThan: time.Second})
	return err
}

// sweepStep runs the relays' lane sweep once.
type sweepStep struct{}

func (sweepStep) String() string { return "sweep" }

func (sweepStep) run(w *world) error {
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	_, err := outbox.SweepLanes(ctx, w.env.app, w.env.schema)
	return err
}

func parseNoArgs(name string, mk func() ilvStep) func([]string) (ilvStep, error) {
	return func(a []string) (ilvStep, error) {
		if len(a) != 0 {
			return nil, fmt.Errorf("want: %s", name)
		}
		return mk(), nil
	}
}

// --- the consumer ---

// joinStep starts the consumer (a schedule with late-join=true): the
// aggregates with events committed before are the ones it joins mid-way.
type joinStep struct{}

func (joinStep) String() string { return "join" }

func (joinStep) run(w *world) error { w.consumer.joined = true; return nil }

// workerStep: "take" hands worker c the next delivery (a redelivery
// first, else the next message at the destination); "handle" makes it
// handle what it holds with the inbox (Early: redelivered later).
type workerStep struct {
	action string
	c      int
	pause  bool // handle: paused between the charge's claim and its call (see resume)
}

func (s workerStep) String() string {
	if s.pause {
		return fmt.Sprintf("%s c%d pause", s.action, s.c+1)
	}
	return fmt.Sprintf("%s c%d", s.action, s.c+1)
}

func (s workerStep) run(w *world) error {
	c := w.consumer
	if !c.joined || s.c >= len(c.held) {
		return nil
	}
	if c.paused[s.c] != nil {
		return nil // busy in its charge
	}
	switch {
	case s.action == "take":
		return c.take(w, s.c)
	case s.pause:
		return c.pause(w, s.c)
	}
	return c.handle(w, s.c)
}

func parseWorker(action string) func([]string) (ilvStep, error) {
	return func(a []string) (ilvStep, error) {
		if len(a) < 1 || len(a) > 2 || !strings.HasPrefix(a[0], "c") || (len(a) == 2 && (a[1] != "pause" || action != "handle")) {
			return nil, fmt.Errorf("want: %s cN", action)
		}
		n, err := strconv.Atoi(a[0][1:])
		return workerStep{action: action, c: n - 1, pause: len(a) == 2}, err
	}
}

func genWorker(action string) func(*ilvGen) ilvStep {
	return func(g *ilvGen) ilvStep {
		if g.cfg.lateJoin && !g.joined {
			if g.rng.IntN(4) > 0 {
				return nil
			}
			g.joined = true
			return joinStep{}
		}
		return workerStep{action: action, c: g.rng.IntN(g.cfg.workers), pause: action == "handle" && g.cfg.payer != "" && g.rng.IntN(4) == 0}
	}
}

// redeliverStep: the broker delivers the i-th message again: one handled
// (its ack was lost) or one a worker still holds (its ack wait ran out).
type redeliverStep struct{ i int }

func (s redeliverStep) String() string { return fmt.Sprintf("redeliver %d", s.i) }

func (s redeliverStep) run(w *world) error {
	c := w.consumer
	var out []outbox.Message
	for _, m := range c.held {
		if m != nil {
			out = append(out, *m)
		}
	}
	for _, p := range c.paused {
		if p != nil {
			out = append(out, p.msg)
		}
	}
	out = append(out, c.handled...)
	if len(out) > 0 {
		c.queue = append(c.queue, out[s.i%len(out)])
	}
	return nil
}

func parseRedeliver(a []string) (ilvStep, error) {
	if len(a) != 1 {
		return nil, errors.New("want: redeliver I")
	}
	i, err := strconv.Atoi(a[0])
	return redeliverStep{i: i}, err
}

func genRedeliver(g *ilvGen) ilvStep { return redeliverStep{i: g.rng.IntN(8)} }

// seedStep seeds the consumer's mark of an aggregate at its mark + k (the
// application restored a snapshot holding those events).
type seedStep struct {
	agg string
	k   int64
}

func (s seedStep) String() string { return fmt.Sprintf("seed %s %d", s.agg, s.k) }

func (s seedStep) run(w *world) error {
	c := w.consumer
	if !c.joined {
		return nil
	}
	id := ilvAggID(s.agg)
	last, err := c.in.LastSequence(w.ctx, ilvAggType, id)
	if err != nil {
		return err
	}
	to := last + s.k
	if err := c.in.Seed(w.ctx, ilvAggType, id, to, "ilv: restored from a snapshot"); err != nil {
		w.note("%s: %v", s, err)
		return nil
	}
	c.floor(id, to)
	return nil
}

func parseSeed(a []string) (ilvStep, error) {
	if len(a) != 2 {
		return nil, errors.New("want: seed AGG K")
	}
	k, err := strconv.ParseInt(a[1], 10, 64)
	return seedStep{agg: a[0], k: k}, err
}

func genSeed(g *ilvGen) ilvStep { return seedStep{agg: g.agg(), k: int64(g.rng.IntN(3))} }

// resolveStep: an operator moves a waiting aggregate's mark past its gap
// (inbox Admin.Resolve), to just below the lowest sequence seen.
type resolveStep struct{ i int }

func (s resolveStep) String() string { return fmt.Sprintf("resolve %d", s.i) }

func (s resolveStep) run(w *world) error {
	rep, err := w.env.iadmin.Waiting(w.ctx, inbox.WaitingFilter{Consumer: ilvConsumerName})
	if err != nil || len(rep.Aggregates) == 0 {
		return err
	}
	a := rep.Aggregates[s.i%len(rep.Aggregates)]
	if a.Wait == nil {
		return nil
	}
	to := a.Wait.Seen - 1
	if _, err := w.env.iadmin.Resolve(w.ctx, inbox.Resolution{Consumer: ilvConsumerName, AggregateType: a.AggregateType, AggregateID: a.AggregateID,
		To: to, By: "ilv", Reason: "ilv: the missing events will not come"}); err != nil {
		w.note("%s: %v", s, err)
		return nil
	}
	w.consumer.floor(a.AggregateID, to)
	return nil
}

func parseResolve(a []string) (ilvStep, error) {
	if len(a) != 1 {
		return nil, errors.New("want: resolve I")
	}
	i, err := strconv.Atoi(a[0])
	return resolveStep{i: i}, err
}

func genResolve(g *ilvGen) ilvStep { return resolveStep{i: g.rng.IntN(3)} }

// --- infrastructure faults ---

// killConnStep kills relay connections (pg_terminate_backend), as a
// failover, a pooler's restart, idle_session_timeout or an operator does.
// Busy ("killconn R"): in the middle of its settle: the relay, paused after
// the destination's answer, is let go while the harness holds one of its
// events' rows, so that its settle waits; its backend is terminated there.
// Idle ("killconn R idle"): every idle connection of the relay's pool,
// wherever it is held; its next statements meet them dead.
type killConnStep struct {
	r    string
	idle bool
}

func (s killConnStep) String() string {
	if s.idle {
		return "killconn " + s.r + " idle"
	}
	return "killconn " + s.r
}

func (s killConnStep) run(w *world) error {
	g := w.relay(s.r)
	if s.idle {
		if g == nil || g.stuck {
			return nil
		}
		var n int
		if err := w.env.app.QueryRow(w.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'idle'`, g.app).Scan(&n); err != nil {
			return err
		}
		w.note("%s: terminated %d", s, n)
		return nil
	}
	if g == nil || g.stuck || g.at != gateAfterAck {
		return nil
	}
	tx, err := w.env.app.Begin(w.ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(w.ctx)) }()
	var held int
	if err := tx.QueryRow(w.ctx, `SELECT count(*) FROM (SELECT 1 FROM `+w.env.schema+`.outbox_events WHERE claimed_by = $1 FOR UPDATE) x`, g.name).Scan(&held); err != nil {
		return err
	}
	g.at = gateNone
	g.release <- struct{}{}
	killed := false
	if held > 0 {
		deadline := time.Now().Add(10 * time.Second)
		for !killed && time.Now().Before(deadline) {
			var n int
			if err := w.env.app.QueryRow(w.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND state = 'active'`, g.app).Scan(&n); err != nil {
				return err
			}
			killed = n > 0
			if !killed {
				select {
				case a := <-g.arrive: // it settled without waiting (nothing to write)
					g.at, g.claimed = a.at, a.events
					return nil
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	_ = tx.Rollback(w.ctx)
	w.note("%s: terminated: %v", s, killed)
	w.waitArrival(g)
	return nil
}

func parseKillConn(a []string) (ilvStep, error) {
	if len(a) < 1 || len(a) > 2 || (len(a) == 2 && a[1] != "idle") {
		return nil, errors.New("want: killconn R [idle]")
	}
	return killConnStep{r: a[0], idle: len(a) == 2}, nil
}

func genKillConn(g *ilvGen) ilvStep {
	if g.rng.IntN(2) == 0 {
		// Sorted: the draw must not depend on the map's order.
		var paused []string
		for r, p := range g.paused {
			if p {
				paused = append(paused, r)
			}
		}
		sort.Strings(paused)
		if len(paused) > 0 {
			r := paused[g.rng.IntN(len(paused))]
			delete(g.paused, r)
			return killConnStep{r: r}
		}
	}
	return killConnStep{r: g.relayName(), idle: true}
}

// pinStep opens (pin) or ends (unpin) a transaction that holds a snapshot
// and a transaction id across any number of rounds (BEGIN; SELECT
// txid_current(), as a forgotten psql or a long migration does), pinning
// the database's xmin: nothing deleted or updated since can be vacuumed
// while it is open, and every snapshot lists it as running.
type pinStep struct{ on bool }

func (s pinStep) String() string {
	if s.on {
		return "pin"
	}
	return "unpin"
}

func (s pinStep) run(w *world) error {
	if !s.on {
		if w.pin != nil {
			_ = w.pin.Rollback(w.ctx)
			w.pin = nil
		}
		return nil
	}
	if w.pin != nil {
		return nil
	}
	tx, err := w.env.app.BeginTx(w.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(w.ctx, `SELECT txid_current(), (SELECT count(*) FROM `+w.env.schema+`.outbox_events)`); err != nil {
		_ = tx.Rollback(w.ctx)
		return err
	}
	w.pin = tx
	return nil
}

func genPin(g *ilvGen) ilvStep {
	g.pinned = !g.pinned
	return pinStep{on: g.pinned}
}
