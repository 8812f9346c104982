package outbox_test

// The world an interleaving schedule runs in: a schema of its own on the
// real PostgreSQL whose clock the harness moves (see ilvClock), relays
// running their real Run loops but held at boundaries (ilvRelay), writers
// with open transactions, an operator, a consumer with several workers over
// the inbox, and a destination (an embedded NATS JetStream server or a kfake
// Kafka cluster) behind a publisher that injects per-message faults.
// TestInterleavings (interleave_test.go) generates, runs, checks and shrinks
// the schedules; interleave_steps_test.go has the steps.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxkafka"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

// The relays' settings in a schedule. Time in the database is the
// harness's (ilvClock): frozen while the steps run, so that leases expire
// and backoffs end only when a tick step says so, and flowing at the real
// pace in the liveness phase. The lease and the backoffs are scaled down
// (production: 30 s, 1 s to 5 min) so that the liveness phase stays short;
// a relay held after its claim for 80% of the lease (3.2 s) releases its
// batch unpublished, as a relay that fell behind its lease does.
const (
	ilvLease       = 4 * time.Second
	ilvBackoffMin  = 20 * time.Millisecond
	ilvBackoffMax  = 5 * time.Second // --retry-max, scaled
	ilvMaxAttempts = 4
	// ilvProbeMax is the relays' OutageProbeMax: in an outage a relay looks
	// at the destination again after 2 ms, 4 ms, ... up to 16 ms (1 s in
	// production), and once it is back, publishes at once.
	ilvProbeMax = 16 * time.Millisecond
	// ilvPoll is the relays' PollInterval. In the steps a relay let go
	// from a claim is woken (advance), so it claims again at once; once
	// the faults stop, a relay that found nothing looks again after it, or
	// at once when woken (a commit, the operator's retry), so that the
	// relays do not spend the machine on empty claims while the harness
	// waits for the table (the liveness phase) and the consumer (drain).
	ilvPoll = 20 * time.Millisecond
	// ilvRescanLong is the RescanInterval of most schedules: longer than
	// any schedule, so that the incremental claim must publish every event
	// on its own, within the liveness bound, without the full scan's help.
	ilvRescanLong = time.Hour
	// ilvSlack is the liveness bound beyond an event's own retry backoff:
	// once the faults stop, every committed event is published within it,
	// and within ilvSlackRounds claims of every running relay: on a loaded
	// machine the relays' rounds, not the clock, say how long they had (a
	// relay starved of CPU for seconds makes few claims in ilvSlack, while
	// an event the relays pass over stays unpublished whatever their
	// number). On an idle machine a relay makes ilvSlackRounds claims well
	// within ilvSlack (one every ilvPoll at least), so the bound is
	// ilvSlack there, as before; ilvSlackCap bounds the wait for the rounds
	// (a relay that makes no claim for that long is itself reported).
	ilvSlack       = 3 * time.Second
	ilvSlackRounds = 50
	ilvSlackCap    = time.Minute
	// ilvLockGrace: a relay waiting this long on a lock while every other
	// actor is idle waits on an application's transaction.
	ilvLockGrace    = time.Second
	ilvAggType      = "acct"
	ilvConsumerName = "ilv"
	// ilvTopicLimit is the Kafka topic's max.message.bytes; a "big" event's
	// payload is over it (and under outboxkafka's MaxRecordBytes, so the
	// broker is what refuses it).
	ilvTopicLimit = 64 << 10
	ilvBigPayload = 200 << 10
)

// ilvBigPad is a big event's payload filler: random, so that compression
// does not bring the record under the topic's limit.
var ilvBigPad = func() string {
	rng := rand.New(rand.NewPCG(19, 5))
	b := make([]byte, ilvBigPayload*3/4)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)
}()

// ilvLongID is the aggregate id the step language calls L: 500 bytes, near
// the 512-byte limit.
var ilvLongID = "L" + strings.Repeat("o", 499)

func ilvAggID(token string) string {
	if token == "L" {
		return ilvLongID
	}
	return token
}

func ilvAggName(id string) string {
	if id == ilvLongID {
		return "L"
	}
	return id
}

// ilvEnv is one harness worker's long-lived resources, reused by every
// schedule it runs: the schema (emptied between schedules, not migrated
// again), the pools, the NATS stream, the Kafka cluster.
type ilvEnv struct {
	worker     int
	schema     string
	clock      string
	app        *pgxpool.Pool   // writers, operator, consumer, checks
	relayPools []*pgxpool.Pool // one per relay: its backends are named after it
	appNames   []string
	writer     *outbox.Writer
	admin      *outbox.Admin
	iadmin     *inbox.Admin
	js         jetstream.JetStream
	stream     string
	streamBase uint64 // the stream's last sequence before this schedule
	natsPub    *outboxnats.Publisher
	kafka      *kfake.Cluster
	kadm       *kadm.Client
	kcl        *kgo.Client
	providers  map[string]*ilvProvider // by mode
	runs       int
}

const ilvMaxRelays = 3

// ilvCreep is how fast the frozen clock moves, against real time.
const ilvCreep = "0.001"

// newIlvEnv creates worker w's schema, clock, pools and destinations.
func newIlvEnv(ctx context.Context, worker int, tag string, natsURL string) (*ilvEnv, error) {
	e := &ilvEnv{worker: worker, schema: fmt.Sprintf("ilv_%s_%d", tag, worker)}
	e.clock = e.schema + "_clock"
	setup, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		return nil, err
	}
	defer setup.Close()
	if _, err := outboxmigrate.Migrate(ctx, setup, e.schema); err != nil {
		return nil, fmt.Errorf("migrate %s: %w", e.schema, err)
	}
	// The harness's clock: now() and clock_timestamp() in the schema's
	// sessions (search_path puts them before pg_catalog) read it, and so do
	// the columns whose default is now() (bound to pg_catalog's when the
	// migrations created them: set again here). Flowing, it is t plus the
	// real time since "since". Frozen, it creeps: t plus a thousandth of
	// the real time since "since" (a millisecond a second), so that leases
	// and backoffs end only when a tick says so, and yet, as in production,
	// a later transaction's now() is after an earlier statement's
	// clock_timestamp() (an event released is due at the next claim).
	if _, err := setup.Exec(ctx, `
CREATE SCHEMA IF NOT EXISTS `+e.clock+`;
CREATE TABLE IF NOT EXISTS `+e.clock+`.clock (t timestamptz NOT NULL, flowing bool NOT NULL, since timestamptz NOT NULL);
INSERT INTO `+e.clock+`.clock SELECT pg_catalog.now(), false, pg_catalog.now() WHERE NOT EXISTS (SELECT 1 FROM `+e.clock+`.clock);
CREATE OR REPLACE FUNCTION `+e.clock+`.now() RETURNS timestamptz LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN (SELECT c.t + (pg_catalog.now() - c.since) * CASE WHEN c.flowing THEN 1 ELSE `+ilvCreep+` END FROM `+e.clock+`.clock c); END $$;
CREATE OR REPLACE FUNCTION `+e.clock+`.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS
$$ BEGIN RETURN (SELECT c.t + (pg_catalog.clock_timestamp() - c.since) * CASE WHEN c.flowing THEN 1 ELSE `+ilvCreep+` END FROM `+e.clock+`.clock c); END $$;
DO $$ DECLARE c record; BEGIN
	FOR c IN SELECT table_name, column_name FROM information_schema.columns
		WHERE table_schema = '`+e.schema+`' AND column_default IN ('now()', 'CURRENT_TIMESTAMP', 'clock_timestamp()')
	LOOP
		EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET DEFAULT %I.now()', '`+e.schema+`', c.table_name, c.column_name, '`+e.clock+`');
	END LOOP;
	-- The schema's functions that set their own search_path (enqueue,
	-- the SQL inbox, clean-up) read the clock too: else enqueue's
	-- available_at is the real now() while its occurred_at (the column's
	-- default) is the clock's, and every event written looks scheduled,
	-- never as written (the incremental claim's range scan never read
	-- one: only sqlrow steps, until 6 December 2026).
	FOR c IN SELECT p.oid::regprocedure AS f FROM pg_proc p
		WHERE p.pronamespace = '`+e.schema+`'::regnamespace
		  AND EXISTS (SELECT 1 FROM unnest(p.proconfig) x WHERE x LIKE 'search_path=%')
	LOOP
		EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_catalog, %I, pg_temp', c.f, '`+e.clock+`', '`+e.schema+`');
	END LOOP;
END $$;
CREATE TABLE IF NOT EXISTS `+e.schema+`.ilv_effects (n bigserial PRIMARY KEY, event_id uuid NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL);`); err != nil {
		return nil, fmt.Errorf("create the clock: %w", err)
	}
	pool := func(name string, conns int32) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = conns
		cfg.ConnConfig.RuntimeParams["search_path"] = e.clock + ", pg_catalog"
		cfg.ConnConfig.RuntimeParams["application_name"] = name
		// PostgreSQL does not crash in these schedules: commits need not
		// wait for the WAL's flush, which is most of a short commit's time.
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		// The harness's now() (a function of the clock's schema, not the
		// built-in) makes PostgreSQL plan the relay's claim again at every
		// call (custom plans: 2.3 ms of planning for a 0.4 ms claim, most of
		// a schedule's database time); without the clock it keeps the
		// generic plan after five calls. The generic plan, as in production.
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
		return pgxpool.NewWithConfig(ctx, cfg)
	}
	if e.app, err = pool(e.schema+"_app", 10); err != nil {
		return nil, err
	}
	for i := range ilvMaxRelays {
		name := fmt.Sprintf("%s_r%d", e.schema, i+1)
		p, err := pool(name, 3)
		if err != nil {
			return nil, err
		}
		e.relayPools = append(e.relayPools, p)
		e.appNames = append(e.appNames, name)
	}
	if e.writer, err = outbox.NewWriter(outbox.WriterConfig{Schema: e.schema}); err != nil {
		return nil, err
	}
	if e.admin, err = outbox.NewAdmin(e.app, outbox.AdminConfig{Schema: e.schema}); err != nil {
		return nil, err
	}
	if e.iadmin, err = inbox.NewAdmin(e.app, inbox.AdminConfig{Schema: e.schema}); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	if e.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	e.stream = strings.ToUpper(e.schema)
	if e.natsPub, err = outboxnats.NewPublisher(ctx, e.js, outboxnats.Config{Stream: e.stream, SubjectPrefix: e.schema, DuplicateWindow: 100 * time.Millisecond}); err != nil {
		return nil, err
	}
	if e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1)); err != nil {
		return nil, err
	}
	if e.kcl, err = kgo.NewClient(kgo.SeedBrokers(e.kafka.ListenAddrs()...)); err != nil {
		return nil, err
	}
	e.kadm = kadm.NewClient(e.kcl)
	return e, nil
}

func (e *ilvEnv) close(ctx context.Context, keep bool) {
	for _, p := range e.providers {
		p.close(ctx, keep)
	}
	for _, p := range e.relayPools {
		p.Close()
	}
	if !keep {
		_, _ = e.app.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE; DROP SCHEMA IF EXISTS "+e.clock+" CASCADE")
		_ = e.js.DeleteStream(ctx, e.stream)
	}
	e.app.Close()
	e.js.Conn().Close()
	e.kcl.Close()
	e.kafka.Close()
}

// reset empties the schema's tables, freezes the clock at the present and
// purges the stream, for the next schedule.
func (e *ilvEnv) reset(ctx context.Context) error {
	s := e.schema
	// DELETE rather than TRUNCATE: the tables are small, and TRUNCATE's
	// new files and catalogue updates cost more than the rows.
	var q strings.Builder
	for _, t := range []string{"outbox_events", "outbox_aggregates", "processed_events", "inbox_aggregates", "outbox_relays",
		"outbox_operations", "side_effects", "ilv_effects"} {
		q.WriteString("DELETE FROM " + s + "." + t + ";\n")
	}
	q.WriteString("UPDATE " + e.clock + ".clock SET t = pg_catalog.now(), flowing = false, since = pg_catalog.now()")
	if _, err := e.app.Exec(ctx, q.String()); err != nil {
		return fmt.Errorf("reset schema: %w", err)
	}
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return err
	}
	if err := st.Purge(ctx); err != nil {
		return fmt.Errorf("purge stream: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	e.streamBase = info.State.LastSeq
	e.runs++
	return nil
}

// ilvDest is where a schedule's relays publish: the real broker, read back
// for the checks and the consumer.
type ilvDest interface {
	publisher() outbox.Publisher
	// messages returns every message at the destination, per aggregate in
	// the order the destination holds them; earlier results are a prefix
	// of later ones.
	messages(ctx context.Context) ([]ilvMsg, error)
	// cached is what messages returned last.
	cached() []ilvMsg
	close()
}

type ilvNATS struct {
	e     *ilvEnv
	cache []ilvMsg
}

func (d *ilvNATS) publisher() outbox.Publisher { return d.e.natsPub }
func (d *ilvNATS) close()                      {}
func (d *ilvNATS) cached() []ilvMsg            { return d.cache }

func (d *ilvNATS) messages(ctx context.Context) ([]ilvMsg, error) {
	st, err := d.e.js.Stream(ctx, d.e.stream)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	for seq := d.e.streamBase + uint64(len(d.cache)) + 1; seq <= info.State.LastSeq; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("stream message %d: %w", seq, err)
		}
		m, err := outboxnats.Decode(raw.Header, raw.Data)
		if err != nil {
			return nil, fmt.Errorf("decode stream message %d: %w", seq, err)
		}
		d.cache = append(d.cache, ilvMsg{key: fmt.Sprint(seq), m: m})
	}
	return d.cache, nil
}

// ilvKafka is a topic of the worker's kfake cluster, made for one
// schedule, whose max.message.bytes is below a big event's record.
type ilvKafka struct {
	e     *ilvEnv
	topic string
	pub   *outboxkafka.Publisher
	read  map[int32]int64 // partition -> next offset to read
	parts map[int32][]ilvMsg
	order []int32
	last  []ilvMsg
}

func newIlvKafka(ctx context.Context, e *ilvEnv) (*ilvKafka, error) {
	d := &ilvKafka{e: e, topic: fmt.Sprintf("ilv_%d_%d", e.worker, e.runs), read: map[int32]int64{}, parts: map[int32][]ilvMsg{}}
	limit := fmt.Sprint(ilvTopicLimit)
	res, err := e.kadm.CreateTopic(ctx, 2, 1, map[string]*string{"max.message.bytes": &limit}, d.topic)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return nil, fmt.Errorf("create topic %s: %w", d.topic, err)
	}
	d.pub, err = outboxkafka.NewPublisher(outboxkafka.Config{Brokers: e.kafka.ListenAddrs(), Topic: d.topic, DeliveryTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	d.order = []int32{0, 1}
	return d, nil
}

func (d *ilvKafka) publisher() outbox.Publisher { return d.pub }
func (d *ilvKafka) cached() []ilvMsg            { return d.last }

func (d *ilvKafka) close() {
	d.pub.Close()
	_, _ = d.e.kadm.DeleteTopics(context.Background(), d.topic)
}

func (d *ilvKafka) messages(ctx context.Context) ([]ilvMsg, error) {
	ends, err := d.e.kadm.ListEndOffsets(ctx, d.topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	from := map[int32]kgo.Offset{}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > d.read[o.Partition] {
			from[o.Partition] = kgo.NewOffset().At(d.read[o.Partition])
			want[o.Partition] = o.Offset
		}
	})
	if len(want) > 0 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(d.e.kafka.ListenAddrs()...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{d.topic: from}))
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for len(want) > 0 {
			fs := cl.PollFetches(rctx)
			if err := rctx.Err(); err != nil {
				return nil, fmt.Errorf("read topic %s: %w", d.topic, err)
			}
			for _, r := range fs.Records() {
				end, ok := want[r.Partition]
				if !ok || r.Offset < d.read[r.Partition] || r.Offset >= end {
					continue
				}
				m, err := outboxkafka.Decode(r)
				if err != nil {
					return nil, err
				}
				d.parts[r.Partition] = append(d.parts[r.Partition], ilvMsg{key: fmt.Sprintf("%d/%d", r.Partition, r.Offset), m: m})
				d.read[r.Partition] = r.Offset + 1
				if r.Offset+1 >= end {
					delete(want, r.Partition)
				}
			}
		}
	}
	// Per aggregate the order is the partition's; across partitions any
	// fixed order will do (the consumer goes by ilvMsg.key).
	var out []ilvMsg
	for _, p := range d.order {
		out = append(out, d.parts[p]...)
	}
	d.last = out
	return out, nil
}

// ilvEvent is what the harness knows of an event it wrote.
type ilvEvent struct {
	id  uuid.UUID
	agg string
	seq int64
	big bool
	// poison: the destination or the relay can never take it
	// ("undecodable" headers written by hand; "oversize" for the Kafka
	// topic); "" for a healthy event.
	poison string
	order  int // commit order
}

// ilvGate is a boundary where a relay is held.
type ilvGate int

const (
	gateNone          ilvGate = iota // running (or stuck), not held
	gateClaim                        // after a claim (ObserveClaim), before publishing it
	gateBeforePublish                // inside Publish, before the destination is called
	gateAfterAck                     // inside Publish, after the destination answered
	gateProbe                        // in an outage, before its look at the destination (Probe)
)

func (g ilvGate) String() string {
	return [...]string{"running", "claimed", "before-publish", "after-ack", "probe"}[g]
}

type ilvArrival struct {
	at     ilvGate
	events int
	err    error
}

// ilvRelay is a relay running its real Run loop, held at boundaries by
// its Observer (after each claim) and its Publisher (before and after the
// destination call): the harness lets it go one boundary at a time. It is
// the relay's Observer and its Publisher, in front of the real one.
type ilvRelay struct {
	w       *world
	name    string
	app     string // application_name of its pool's backends
	r       *outbox.Relay
	real    outbox.Publisher
	arrive  chan ilvArrival
	release chan struct{}
	freed   chan struct{} // closed: no more holding (liveness phase)
	cancel  context.CancelFunc
	done    chan error
	claims  atomic.Int64 // claims made (ObserveClaim), empty or not

	// Harness side (set before release, read by the relay after it).
	at      ilvGate
	claimed int
	plan    map[int]string // outcome per message position in the round
	pos     int
	pauseAt ilvGate
	stuck   bool
	exited  bool // Run returned (its done was received)
}

var (
	_ outbox.ClaimObserver = (*ilvRelay)(nil)
	_ outbox.Prober        = (*ilvRelay)(nil)
)

// Probe holds the relay (a relay in an outage claims nothing: it waits,
// then looks at the destination; a relay step lets it look once), then
// answers as the destination would: unavailable during an outage, else the
// real publisher's probe (both of the harness's have one).
func (g *ilvRelay) Probe(ctx context.Context) error {
	g.hold(gateProbe, 0, nil)
	if g.w.outage.Load() {
		return outbox.Unavailable(errors.New("ilv: the destination is down"))
	}
	if p, ok := g.real.(outbox.Prober); ok {
		return p.Probe(ctx)
	}
	return nil
}

// ObserveClaim holds the relay after every claim, empty or not.
func (g *ilvRelay) ObserveClaim(o outbox.ClaimObservation) {
	g.claims.Add(1)
	g.hold(gateClaim, o.Events, o.Err)
}

func (g *ilvRelay) hold(at ilvGate, n int, err error) {
	select {
	case <-g.freed:
		return
	default:
	}
	g.arrive <- ilvArrival{at: at, events: n, err: err}
	select {
	case <-g.release:
	case <-g.freed:
	}
}

func (g *ilvRelay) free() bool {
	select {
	case <-g.freed:
		return true
	default:
		return false
	}
}

// Publish applies the round's plan: per message, "ok" (to the destination),
// "perm", "retry" or "unavail" (refused without reaching it), "lostack"
// (stored by the destination, its ack lost); every message is unavailable
// during an outage. It holds the relay before or after the destination
// call when the step asked for a pause.
func (g *ilvRelay) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if g.pauseAt == gateBeforePublish && !g.free() {
		g.pauseAt = gateNone
		g.hold(gateBeforePublish, len(msgs), nil)
	}
	errs := make([]error, len(msgs))
	var fwd []outbox.Message
	var fwdAt []int
	lost := map[int]bool{}
	for i, m := range msgs {
		o := "ok"
		if !g.free() {
			if p, ok := g.plan[g.pos]; ok {
				o = p
			}
			g.pos++
		}
		if g.w.outage.Load() {
			errs[i] = outbox.Unavailable(errors.New("ilv: the destination is down"))
			continue
		}
		switch o {
		case "perm":
			g.w.inject(m.ID)
			errs[i] = outbox.Permanent(fmt.Errorf("ilv: the destination refuses event %s", m.ID))
		case "retry":
			g.w.inject(m.ID)
			errs[i] = fmt.Errorf("ilv: event %s failed, try again", m.ID)
		case "unavail":
			g.w.mayCount(m.ID)
			errs[i] = outbox.Unavailable(fmt.Errorf("ilv: unavailable for event %s", m.ID))
		default:
			lost[len(fwd)] = o == "lostack"
			if o == "lostack" {
				g.w.mayCount(m.ID)
			}
			fwd = append(fwd, m)
			fwdAt = append(fwdAt, i)
		}
	}
	if os.Getenv("ILV_DEBUG") != "" && !g.free() {
		g.w.note("%s publish %d: %v", g.name, len(msgs), errs)
	}
	if len(fwd) > 0 {
		res := g.real.Publish(ctx, fwd)
		for j, i := range fwdAt {
			switch {
			case res != nil && res[j] != nil:
				errs[i] = res[j]
			case lost[j]:
				errs[i] = outbox.Unavailable(fmt.Errorf("ilv: no ack for event %s: %w", fwd[j].ID, context.DeadlineExceeded))
			}
		}
	}
	if g.pauseAt == gateAfterAck && !g.free() {
		g.pauseAt = gateNone
		g.hold(gateAfterAck, len(msgs), nil)
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// world is one schedule's run.
type world struct {
	env    *ilvEnv
	ctx    context.Context
	cfg    ilvConfig
	dest   ilvDest
	relays []*ilvRelay

	writers          map[string]*ilvWriter
	events           []*ilvEvent // committed, in commit order
	byID             map[uuid.UUID]*ilvEvent
	rolledBack       map[uuid.UUID]bool
	skipped          map[uuid.UUID]bool // by the harness's operator
	outage           atomic.Bool
	injMu            sync.Mutex
	injected         map[uuid.UUID]bool // events the harness made fail
	consumer         *ilvConsumer
	payer            *ilvPayer // nil: the consumer charges nothing
	pin              pgx.Tx
	clockFlows       bool
	stepLeases       map[uuid.UUID]time.Time // leases taken before the faults stopped: when they end
	ticked           atomic.Int64            // how far tick steps moved the database's clock (ns): the side-effect caller's clock follows
	failed           map[uuid.UUID]int       // per event, the failures the harness made that may count as attempts
	attemptsReported map[uuid.UUID]bool
	aborted          bool

	violations []ilvViolation
	trace      []string
}

type ilvWriter struct {
	tx     pgx.Tx
	events []*ilvEvent
}

type ilvViolation struct{ inv, msg string }

func (v ilvViolation) String() string { return v.inv + ": " + v.msg }

func (w *world) violate(inv, format string, args ...any) {
	w.violations = append(w.violations, ilvViolation{inv, fmt.Sprintf(format, args...)})
}

func (w *world) note(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

func (w *world) inject(id uuid.UUID) {
	w.injMu.Lock()
	w.injected[id] = true
	w.failed[id]++
	w.injMu.Unlock()
}

// mayCount records a failure of event id that the relay may count as an
// attempt (an Unavailable of one message while others were published, which
// it blames on the event after LoneOutageLimit in a row), not an outage.
func (w *world) mayCount(id uuid.UUID) {
	w.injMu.Lock()
	w.failed[id]++
	w.injMu.Unlock()
}

func (w *world) failures(id uuid.UUID) int {
	w.injMu.Lock()
	defer w.injMu.Unlock()
	return w.failed[id]
}

func (w *world) wasInjected(id uuid.UUID) bool {
	w.injMu.Lock()
	defer w.injMu.Unlock()
	return w.injected[id]
}

// newWorld prepares a schedule: empty tables, a frozen clock, the
// destination, the relays started and held after their first claim.
func newWorld(ctx context.Context, e *ilvEnv, cfg ilvConfig) (w *world, err error) {
	if err := e.reset(ctx); err != nil {
		return nil, err
	}
	w = &world{env: e, ctx: ctx, cfg: cfg, writers: map[string]*ilvWriter{}, byID: map[uuid.UUID]*ilvEvent{},
		rolledBack: map[uuid.UUID]bool{}, skipped: map[uuid.UUID]bool{}, injected: map[uuid.UUID]bool{}, failed: map[uuid.UUID]int{}, attemptsReported: map[uuid.UUID]bool{}}
	if cfg.dest == "kafka" {
		d, err := newIlvKafka(ctx, e)
		if err != nil {
			return nil, err
		}
		w.dest = d
	} else {
		w.dest = &ilvNATS{e: e}
	}
	in, err := inbox.New(e.app, inbox.Config{Consumer: ilvConsumerName, Schema: e.schema, StartAtFirstSeen: cfg.firstSeen})
	if err != nil {
		return nil, err
	}
	if cfg.payer != "" {
		if w.payer, err = newIlvPayer(ctx, e, cfg.payer, w.clock); err != nil {
			return nil, err
		}
	}
	w.consumer = &ilvConsumer{in: in, held: make([]*outbox.Message, cfg.workers), paused: make([]*ilvPaused, cfg.workers), joined: !cfg.lateJoin, preexisting: map[string]bool{}, delivered: map[string]bool{}}
	for i := range cfg.relays {
		g := &ilvRelay{w: w, name: fmt.Sprintf("r%d", i+1), app: e.appNames[i], real: w.dest.publisher(),
			arrive: make(chan ilvArrival, 1), release: make(chan struct{}), freed: make(chan struct{}), done: make(chan error, 1)}
		r, err := outbox.NewRelay(e.relayPools[i], outbox.RelayConfig{
			Publisher: g, Observer: g, Schema: e.schema, ID: g.name, BatchSize: cfg.batch,
			LeaseDuration: ilvLease, PollInterval: ilvPoll, CatchUpInterval: -1, RescanInterval: cfg.rescan, OutageProbeMax: ilvProbeMax,
			RetryBackoffMin: ilvBackoffMin, RetryBackoffMax: ilvBackoffMax, MaxAttempts: ilvMaxAttempts,
			ShutdownTimeout: time.Second, DisableClaimAhead: true, DisableNotify: true, DisablePipelining: cfg.noPipelining,
			HeartbeatInterval: outbox.RelayHeartbeatLifetimeMax / 3, LaneSweepInterval: time.Hour, VacuumInterval: -1, Logger: discardLogger(),
		})
		if err != nil {
			return nil, err
		}
		g.r = r
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		g.cancel = cancel
		go func() { g.done <- r.Run(rctx) }()
		w.relays = append(w.relays, g)
		w.waitArrival(g)
	}
	return w, nil
}

// relay returns relay name ("r2"), or nil when the schedule has fewer.
func (w *world) relay(name string) *ilvRelay {
	for _, g := range w.relays {
		if g.name == name {
			return g
		}
	}
	return nil
}

// advance lets a held relay go to its next boundary and waits for it.
func (w *world) advance(g *ilvRelay) {
	if g.at == gateNone {
		return
	}
	g.pos = 0
	g.at = gateNone
	g.r.Wake() // its next claim is not held back by PollInterval
	g.release <- struct{}{}
	w.waitArrival(g)
}

// waitArrival waits until g is held at a boundary. A relay that waits on
// a lock for ilvLockGrace meanwhile is stuck behind an application's
// transaction (nothing else in the world is running): a liveness
// violation, and the end of the schedule's steps.
func (w *world) waitArrival(g *ilvRelay) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(ilvBackoffMax + 10*time.Second)
	for {
		select {
		case a := <-g.arrive:
			g.at, g.claimed = a.at, a.events
			if os.Getenv("ILV_DEBUG") != "" {
				w.note("%s held %s (%d events)", g.name, a.at, a.events)
			}
			if a.err != nil {
				w.note("%s: claim failed: %v", g.name, a.err)
			}
			return
		case err := <-g.done:
			w.violate("liveness", "relay %s stopped: %v", g.name, err)
			g.stuck, g.exited, w.aborted = true, true, true
			return
		case <-tick.C:
			if why := w.lockWait(g.app); why != "" {
				w.violate("liveness", "relay %s blocked: %s; nothing it claimed is published meanwhile", g.name, why)
				g.stuck, w.aborted = true, true
				return
			}
			if time.Now().After(deadline) {
				w.violate("liveness", "relay %s did not come back from its round", g.name)
				g.stuck, w.aborted = true, true
				return
			}
		}
	}
}

// lockWait describes the lock a backend of application app has waited on
// for ilvLockGrace that an idle transaction (an application's, open
// between its statements) holds, or returns "".
func (w *world) lockWait(app string) string {
	var pid int
	var query, blockers string
	err := w.env.app.QueryRow(w.ctx, `SELECT a.pid, left(a.query, 100), string_agg(b.application_name || ' (' || b.state || ', ' || left(b.query, 60) || ')', '; ')
FROM pg_stat_activity a
JOIN pg_stat_activity b ON b.pid = ANY (pg_blocking_pids(a.pid))
WHERE a.application_name = $1 AND a.wait_event_type = 'Lock' AND a.state = 'active'
  AND b.state LIKE 'idle in transaction%'
  AND pg_catalog.clock_timestamp() - a.query_start > $2 * interval '1 millisecond'
GROUP BY a.pid, a.query
LIMIT 1`, app, ilvLockGrace.Milliseconds()).Scan(&pid, &query, &blockers)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("its statement %q waits on a lock held by an idle transaction of %s", oneLine(query), oneLine(blockers))
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// tick moves the database's clock forward, and the side-effect caller's
// with it.
func (w *world) tick(d time.Duration) error {
	_, err := w.env.app.Exec(w.ctx, `UPDATE `+w.env.clock+`.clock SET t = t + $1 * interval '1 millisecond'`, d.Milliseconds())
	if err == nil {
		w.ticked.Add(int64(d.Truncate(time.Millisecond)))
	}
	return err
}

// clock is the side-effect caller's clock (sideeffect.Config.Clock): real
// time, moved by the ticks as the database's is.
func (w *world) clock() time.Time { return time.Now().Add(time.Duration(w.ticked.Load())) }

// ilvWake wakes every relay, as a writer's notification after its commit
// does.
func (w *world) wake() {
	for _, g := range w.relays {
		g.r.Wake()
	}
}

func (w *world) commitEvents(evs []*ilvEvent) {
	for _, ev := range evs {
		ev.order = len(w.events)
		if w.cfg.dest == "kafka" && ev.big {
			ev.poison = "oversize"
		}
		w.events = append(w.events, ev)
		w.byID[ev.id] = ev
		if !w.consumer.joined {
			w.consumer.preexisting[ev.agg] = true
		}
	}
}

// stop ends the schedule's actors: open transactions rolled back, relays
// let go and stopped.
func (w *world) stop() {
	for name, wr := range w.writers {
		_ = wr.tx.Rollback(context.WithoutCancel(w.ctx))
		delete(w.writers, name)
	}
	if w.pin != nil {
		_ = w.pin.Rollback(context.WithoutCancel(w.ctx))
		w.pin = nil
	}
	for i, p := range w.consumer.paused {
		if p != nil {
			close(p.gate)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
			}
			w.consumer.paused[i] = nil
		}
	}
	for _, g := range w.relays {
		select {
		case <-g.freed:
		default:
			close(g.freed)
		}
		g.cancel()
	}
	for _, g := range w.relays {
		if g.exited {
			continue
		}
		select {
		case <-g.done:
		case <-time.After(30 * time.Second):
			w.violate("liveness", "relay %s did not stop within 30s of its context's end", g.name)
		}
	}
	w.dest.close()
}

// sortedAggs returns the aggregates of the committed events, sorted.
func (w *world) sortedAggs() []string {
	seen := map[string]bool{}
	for _, ev := range w.events {
		seen[ev.agg] = true
	}
	var out []string
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}
