package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/outboxnats"
)

// evRec is what the pressure run knows of one event: when its transaction
// committed (or that it rolled back), when it first reached the consumer of
// the stream, and how often it was seen on the wire.
type evRec struct {
	commit     int64 // unix ns when Commit returned; 0 while in flight or when it did not commit
	arrive     int64 // unix ns of the first delivery to the consumer; 0 until then
	firstWire  int64 // unix ns of the first publish seen on the wire
	agg        int32
	seq        int32
	phase      int16 // the phase in which the writer began it (-1: warm-up)
	wire       int32 // publishes seen on the wire (JetStream deduplicates the repeats the consumer would see)
	deliveries int32 // deliveries to the consumer
	state      uint8 // evInFlight, evCommitted, evRolledBack, evUncertain
}

const (
	evInFlight uint8 = iota
	evCommitted
	evRolledBack
	evUncertain // the commit's outcome is unknown (the writer's connection failed in COMMIT)
)

// republish is one event seen on the wire more than once.
type republish struct {
	ix  int32
	gap time.Duration // from the first publish to this one
	at  int64         // unix ns of the first publish
}

// ledger is the run's account of every event: the writers register each
// event before they commit it, the consumer and the wire tap note what
// reached the stream. It is safe for concurrent use.
type ledger struct {
	mu         sync.Mutex
	idx        map[uuid.UUID]int32
	ev         []evRec
	last       []int32 // per aggregate: highest sequence delivered first so far
	republ     []republish
	phantoms   []phantom
	outOfOrder []outOfOrder
	wireOnly   int // publishes on the wire of ids the ledger does not know

	committed, arrived atomic.Int64 // events committed, and of those, arrived
}

// phantom is a delivery of an event no committed transaction wrote.
type phantom struct {
	id         uuid.UUID
	rolledBack bool
}

// outOfOrder is a first delivery that did not follow its aggregate's
// previous sequence.
type outOfOrder struct {
	ix       int32
	got, was int32
}

func newLedger(aggregates int) *ledger {
	return &ledger{idx: make(map[uuid.UUID]int32, 1<<16), last: make([]int32, aggregates)}
}

// register notes an event a writer inserted, before its commit.
func (l *ledger) register(id uuid.UUID, agg int, seq int64, phase int) int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ix := int32(len(l.ev))
	l.idx[id] = ix
	l.ev = append(l.ev, evRec{agg: int32(agg), seq: int32(seq), phase: int16(phase)})
	return ix
}

// settle notes the outcome of an event's transaction.
func (l *ledger) settle(ix int32, state uint8, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := &l.ev[ix]
	ev.state = state
	if state == evRolledBack && ev.arrive != 0 { // delivered before the rollback returned here
		l.phantoms = append(l.phantoms, phantom{rolledBack: true})
	}
	if state == evCommitted {
		ev.commit = at.UnixNano()
		l.committed.Add(1)
		if ev.arrive != 0 { // delivered before Commit returned here
			l.arrived.Add(1)
		}
	}
}

// backlog is how many committed events have not reached the consumer yet.
func (l *ledger) backlog() int64 { return l.committed.Load() - l.arrived.Load() }

// wire notes a publish of id seen on the wire (a core NATS subscription to
// the stream's subjects: it sees every publish, also those JetStream drops
// as duplicates).
func (l *ledger) wire(id uuid.UUID, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ix, ok := l.idx[id]
	if !ok {
		l.wireOnly++
		return
	}
	ev := &l.ev[ix]
	ev.wire++
	if ev.firstWire == 0 {
		ev.firstWire = now
		return
	}
	l.republ = append(l.republ, republish{ix: ix, gap: time.Duration(now - ev.firstWire), at: ev.firstWire})
}

// deliver notes a delivery of the consumer and checks the order of first
// deliveries per aggregate.
func (l *ledger) deliver(id uuid.UUID, seq int64, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ix, ok := l.idx[id]
	if !ok {
		l.phantoms = append(l.phantoms, phantom{id: id})
		return
	}
	ev := &l.ev[ix]
	ev.deliveries++
	if ev.deliveries > 1 {
		return
	}
	ev.arrive = now
	switch ev.state {
	case evRolledBack:
		l.phantoms = append(l.phantoms, phantom{id: id, rolledBack: true})
		return
	case evCommitted:
		l.arrived.Add(1)
	}
	if int32(seq) != l.last[ev.agg]+1 {
		l.outOfOrder = append(l.outOfOrder, outOfOrder{ix: ix, got: int32(seq), was: l.last[ev.agg]})
	}
	l.last[ev.agg] = max(l.last[ev.agg], int32(seq))
}

// pressureDest is the stream's consumer and the wire tap of one run.
type pressureDest struct {
	cons     jetstream.ConsumeContext
	tap      *nats.Subscription
	nc       *nats.Conn
	badMsgs  atomic.Int64 // deliveries without a usable id or sequence
	tapDrops func() int
}

// aggPrefix names the run's aggregates: aggPrefix + index.
const aggPrefix = "p-"

// openDestination starts the consumer of the space's stream (every
// message, from the start) and the wire tap, both feeding l. The stream must
// exist.
func openDestination(ctx context.Context, e *env, s space, l *ledger) (*pressureDest, error) {
	nc, err := nats.Connect(e.o.natsURL, nats.Name("outbox-bench-pressure-consumer"))
	if err != nil {
		return nil, err
	}
	d := &pressureDest{nc: nc}
	d.tap, err = nc.Subscribe(s.prefix+".>", func(m *nats.Msg) {
		id, err := uuid.Parse(m.Header.Get(outboxnats.HeaderID))
		if err != nil {
			return // not an event (a JetStream API message)
		}
		l.wire(id, time.Now().UnixNano())
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	if err := d.tap.SetPendingLimits(-1, -1); err != nil {
		nc.Close()
		return nil, err
	}
	d.tapDrops = func() int { n, _ := d.tap.Dropped(); return n }
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	st, err := js.Stream(ctx, s.stream)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		nc.Close()
		return nil, err
	}
	d.cons, err = cons.Consume(func(m jetstream.Msg) {
		now := time.Now().UnixNano()
		h := m.Headers()
		id, err := uuid.Parse(h.Get(outboxnats.HeaderID))
		if err != nil {
			d.badMsgs.Add(1)
			return
		}
		seq, err := strconv.ParseInt(h.Get(outboxnats.HeaderSequence), 10, 64)
		if err != nil {
			d.badMsgs.Add(1)
			return
		}
		l.deliver(id, seq, now)
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return d, nil
}

func (d *pressureDest) close() {
	d.cons.Stop()
	_ = d.tap.Unsubscribe()
	d.nc.Close()
}

// firstArrivalAfter is the earliest first delivery (unix ns) of the events
// committed at or after t (unix ns), or 0 when none arrived.
func (l *ledger) firstArrivalAfter(t int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first int64
	for i := range l.ev {
		ev := &l.ev[i]
		if ev.state == evCommitted && ev.commit >= t && ev.arrive != 0 && (first == 0 || ev.arrive < first) {
			first = ev.arrive
		}
	}
	return first
}
