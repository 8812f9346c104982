package outboxmigrate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/sideeffect"
)

// warnings records the records at Warn and above a relay logs: a right the
// grants forgot shows up as a failed heartbeat, sweep or clean-up there.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.mu.Lock()
	w.msgs = append(w.msgs, msg)
	w.mu.Unlock()
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// refused fails the test unless err is PostgreSQL's insufficient_privilege.
func refused(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s: got %v, want permission denied (42501)", what, err)
	}
}

// TestGrantsLeastPrivilege applies the printed grants to four fresh login
// roles and runs each role's work as that role: what it needs works (the
// writer through the Go Writer and through the SQL functions, the relay
// publishing a batch with a quarantine and a parked lane, the operator's
// commands, a consumer's inbox), and each abuse the review found is
// refused.
func TestGrantsLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	roles := outboxmigrate.Roles{
		Writer:   outboxtest.UniqueName(t, "w"),
		Relay:    outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"),
		Consumer: outboxtest.UniqueName(t, "c"),
	}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // before the schema is dropped, after the role's pool closed
			ctx := context.Background()
			if _, err := pool.Exec(ctx, "DROP OWNED BY "+r); err != nil {
				t.Errorf("drop owned by %s: %v", r, err)
			}
			if _, err := pool.Exec(ctx, "DROP ROLE "+r); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		})
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id int PRIMARY KEY); INSERT INTO "+schema+".orders VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("apply grants: %v\n%s", err, script)
	}
	as := func(role string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.User = role
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	writerDB, relayDB, operatorDB, consumerDB := as(roles.Writer), as(roles.Relay), as(roles.Operator), as(roles.Consumer)
	events, aggregates, operations := schema+".outbox_events", schema+".outbox_aggregates", schema+".outbox_operations"
	count := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Writer, through the Go Writer: a and d due, b and c to be refused by
	// the destination (the relay quarantines them), and an event behind b
	// (parked with its lane).
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var recs []outbox.Recorded
	err = pgx.BeginFunc(ctx, writerDB, func(tx pgx.Tx) error {
		var err error
		recs, err = w.InsertTx(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "a", Type: "Placed", Payload: []byte(`{"n":1}`)},
			outbox.Event{AggregateType: "order", AggregateID: "b", Type: "Poison", Payload: []byte(`{"n":2}`)},
			outbox.Event{AggregateType: "order", AggregateID: "b", Type: "Later", Payload: []byte(`{"n":3}`)},
			outbox.Event{AggregateType: "order", AggregateID: "c", Type: "Poison", Payload: []byte(`{"n":4}`)})
		if err != nil {
			return err
		}
		_, err = w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "d", Type: "Placed", Payload: []byte(`{"n":5}`)})
		return err
	})
	if err != nil {
		t.Fatalf("writer InsertTx: %v", err)
	}
	if err := w.Notify(ctx, writerDB); err != nil {
		t.Fatalf("writer Notify: %v", err)
	}
	// Writer, through the SQL functions, as another language would.
	var seq int64
	if err := writerDB.QueryRow(ctx, "SELECT sequence FROM "+schema+".enqueue('order', 'a', 'Shipped', '{\"n\":6}')").Scan(&seq); err != nil || seq != 2 {
		t.Fatalf("writer enqueue: sequence %d, %v; want 2", seq, err)
	}
	var many int
	if err := writerDB.QueryRow(ctx, "SELECT count(*) FROM "+schema+`.enqueue_many('[{"aggregate_type":"order","aggregate_id":"e","event_type":"Placed","payload":{"n":7}},
		{"aggregate_type":"order","aggregate_id":"e","event_type":"Paid","payload_base64":"eyJuIjo4fQ=="}]')`).Scan(&many); err != nil || many != 2 {
		t.Fatalf("writer enqueue_many: %d rows, %v; want 2", many, err)
	}
	if _, err := writerDB.Exec(ctx, "SELECT "+schema+".wake()"); err != nil {
		t.Fatalf("writer wake: %v", err)
	}
	// Each abuse of the writer's old table rights.
	for what, stmt := range map[string]string{
		"writer lowers a counter":          "UPDATE " + aggregates + " SET last_sequence = 1 WHERE aggregate_id = 'a'",
		"writer raises a counter":          "UPDATE " + aggregates + " SET last_sequence = last_sequence + 100 WHERE aggregate_id = 'a'",
		"writer upserts a counter":         "INSERT INTO " + aggregates + " (aggregate_type, aggregate_id, last_sequence) VALUES ('order', 'a', 1000) ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = 1000",
		"writer parks a lane":              "UPDATE " + aggregates + " SET parked_at = now(), parked_through = last_sequence WHERE aggregate_id = 'd'",
		"writer inserts a published row":   "INSERT INTO " + events + " (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, published_at) VALUES (gen_random_uuid(), 'order', 'z', 1, 'Forged', '\\x7b7d', now())",
		"writer inserts a quarantined row": "INSERT INTO " + events + " (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, quarantined_at, last_error) VALUES (gen_random_uuid(), 'order', 'z', 1, 'Forged', '\\x7b7d', now(), 'forged')",
		"writer reads outbox_operations":   "SELECT * FROM " + operations,
		"writer sets published_at":         "UPDATE " + events + " SET published_at = now()",
		"writer reads payloads":            "SELECT payload_bytes FROM " + events,
		"writer calls an internal helper":  "SELECT " + schema + ".enqueue_hold('[]')",
		"writer cleans up events":          "SELECT " + schema + ".cleanup_events('0', 1000)",
	} {
		_, err := writerDB.Exec(ctx, stmt)
		refused(t, err, what)
	}

	// Relay: publishes to a real stream, with clean-up and a fast lane
	// sweep, and logs no failure. The destination refuses the Poison events
	// until healed: the relay quarantines them and parks b's lane.
	nats := natstest.Embedded(t)
	js := natstest.JetStream(t, natstest.Connect(t, nats.ClientURL()))
	natsCfg := natstest.Config(t)
	natsCfg.MonitorURL = nats.MonitorURL()
	pub := natstest.Publisher(t, js, natsCfg)
	var healed atomic.Bool
	refusing := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := pub.Publish(ctx, msgs)
		if errs == nil {
			errs = make([]error, len(msgs))
		}
		for i, m := range msgs {
			if m.Type == "Poison" && !healed.Load() {
				errs[i] = outbox.Permanent(errors.New("refused by the destination"))
			}
		}
		return errs
	})
	warned := &warnings{}
	relay, err := outbox.NewRelay(relayDB, outbox.RelayConfig{
		Publisher: refusing, Schema: schema, Logger: slog.New(warned),
		HeartbeatInterval: 50 * time.Millisecond, LaneSweepInterval: 50 * time.Millisecond,
		Cleanup: outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: time.Hour}, CleanupInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() {
		stopRelay()
		<-relayDone
	}()
	published := func() int {
		return count("SELECT count(*) FROM " + events + " WHERE published_at IS NOT NULL AND skipped_at IS NULL")
	}
	outboxtest.Eventually(t, 15*time.Second, "the relay publishes the five due events and quarantines the two refused", func() bool {
		return published() == 5 && count("SELECT count(*) FROM "+events+" WHERE quarantined_at IS NOT NULL") == 2
	})
	outboxtest.Eventually(t, 15*time.Second, "the relay parks b's lane", func() bool {
		return count("SELECT count(*) FROM "+aggregates+" WHERE aggregate_id = 'b' AND parked_at IS NOT NULL") == 1 &&
			count("SELECT count(*) FROM "+events+" WHERE aggregate_id = 'b' AND available_at = 'infinity'") == 1
	})
	for what, stmt := range map[string]string{
		"relay rewrites an unpublished payload": "UPDATE " + events + " SET payload_bytes = '\\x7b7d' WHERE published_at IS NULL",
		"relay rewrites a sequence":             "UPDATE " + events + " SET aggregate_sequence = aggregate_sequence + 10 WHERE published_at IS NULL",
		"relay rewrites headers":                "UPDATE " + events + " SET headers = '{\"x\":\"y\"}' WHERE published_at IS NULL",
		"relay deletes an unpublished event":    "DELETE FROM " + events + " WHERE published_at IS NULL",
		"relay moves a counter":                 "UPDATE " + aggregates + " SET last_sequence = 1",
		"relay deletes from outbox_operations":  "DELETE FROM " + operations,
		"relay reads a business table":          "SELECT * FROM " + schema + ".orders",
		"relay inserts an event":                "INSERT INTO " + events + " (event_id) VALUES (gen_random_uuid())",
		"relay enqueues":                        "SELECT " + schema + ".enqueue('order', 'x', 'T', '{}')",
	} {
		_, err := relayDB.Exec(ctx, stmt)
		refused(t, err, what)
	}

	// Operator: status, quarantine list, retry (the relay then publishes
	// the event and its parked successor), skip, replay, clean-up, inbox
	// status; no writing events, no rewriting the audit log.
	admin, err := outbox.NewAdmin(operatorDB, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatalf("operator Status: %v", err)
	}
	if st.Quarantined != 2 || st.RelaysAlive != 1 {
		t.Errorf("Status: %d quarantined, %d relays alive; want 2, 1", st.Quarantined, st.RelaysAlive)
	}
	if q, err := admin.ListQuarantined(ctx, outbox.QuarantineFilter{}); err != nil || len(q) != 2 {
		t.Errorf("operator ListQuarantined: %d events, %v; want 2", len(q), err)
	}
	healed.Store(true)
	if _, err := admin.Retry(ctx, recs[1].ID, "test"); err != nil {
		t.Errorf("operator Retry: %v", err)
	}
	if _, err := admin.Skip(ctx, recs[3].ID, "test", "least privilege test"); err != nil {
		t.Errorf("operator Skip: %v", err)
	}
	outboxtest.Eventually(t, 15*time.Second, "the relay publishes the retried event and its unparked successor", func() bool { return published() == 7 })
	replayed := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error { return make([]error, len(msgs)) })
	if res, err := admin.Replay(ctx, replayed, outbox.ReplayConfig{AggregateType: "order", AggregateID: "a", By: "test"}); err != nil || res.Events != 2 {
		t.Errorf("operator Replay: %d events, %v; want 2", res.Events, err)
	}
	if n := count("SELECT count(*) FROM " + operations + " WHERE action = 'replay' AND detail ? 'finished_at'"); n != 1 {
		t.Errorf("%d replay rows record their outcome, want 1", n)
	}
	var again bool
	if err := operatorDB.QueryRow(ctx, "SELECT "+schema+".replay_finished(operation_id, 0, 0, 'forged') FROM "+operations+" WHERE action = 'replay'").Scan(&again); err != nil || again {
		t.Errorf("replay_finished on a finished replay: %v, %v; want false", again, err)
	}
	unpublished := count("SELECT count(*) FROM " + events + " WHERE published_at IS NULL")
	if _, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Microsecond, InboxOlderThan: time.Hour}); err != nil {
		t.Errorf("operator Cleanup: %v", err)
	}
	if n := count("SELECT count(*) FROM " + events + " WHERE published_at IS NOT NULL AND skipped_at IS NULL"); n != 0 {
		t.Errorf("operator Cleanup left %d published events", n)
	}
	if n := count("SELECT count(*) FROM " + events + " WHERE published_at IS NULL"); n != unpublished {
		t.Errorf("operator Cleanup: %d unpublished events, want %d", n, unpublished)
	}
	inboxAdmin, err := inbox.NewAdmin(operatorDB, inbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inboxAdmin.Waiting(ctx, inbox.WaitingFilter{}); err != nil {
		t.Errorf("operator inbox Waiting: %v", err)
	}
	seAdmin, err := sideeffect.NewAdmin(operatorDB, sideeffect.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seAdmin.Status(ctx, 10); err != nil {
		t.Errorf("operator side-effect Status: %v", err)
	}
	// An unpublished event to try to delete: written by the writer now.
	if _, err := writerDB.Exec(ctx, "SELECT * FROM "+schema+".enqueue('order', 'f', 'Placed', '{}')"); err != nil {
		t.Fatal(err)
	}
	for what, stmt := range map[string]string{
		"operator inserts an event":                "INSERT INTO " + events + " (event_id) VALUES (gen_random_uuid())",
		"operator rewrites an audit row":           "UPDATE " + operations + " SET reason = 'nothing happened', actor = 'someone else'",
		"operator deletes audit rows":              "DELETE FROM " + operations,
		"operator deletes an unpublished event":    "DELETE FROM " + events + " WHERE published_at IS NULL",
		"operator rewrites an unpublished payload": "UPDATE " + events + " SET payload_bytes = '\\x7b7d' WHERE published_at IS NULL",
		"operator rewrites a sequence":             "UPDATE " + events + " SET aggregate_sequence = aggregate_sequence + 10 WHERE published_at IS NULL",
		"operator moves a counter":                 "UPDATE " + aggregates + " SET last_sequence = 1",
	} {
		_, err := operatorDB.Exec(ctx, stmt)
		refused(t, err, what)
	}
	if n := count("SELECT count(*) FROM " + operations); n != 3 {
		t.Errorf("audit log has %d rows, want 3 (retry, skip, replay)", n)
	}
	if n := count("SELECT count(*) FROM " + events + " WHERE aggregate_id = 'f'"); n != 1 {
		t.Errorf("the unpublished event f: %d rows, want 1", n)
	}

	// Consumer: an inbox applies, deduplicates and holds back an early
	// event; it reads no event and writes none.
	in, err := inbox.New(consumerDB, inbox.Config{Schema: schema, Consumer: "billing", StartAtFirstSeen: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.StartPoint(ctx); err != nil {
		t.Errorf("consumer StartPoint: %v", err)
	}
	msg := func(seq int64) outbox.Message {
		return outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "new", Sequence: seq, Type: "Placed",
			Payload: []byte(`{}`), OccurredAt: time.Now().Add(time.Hour)}
	}
	apply := func(context.Context, pgx.Tx, outbox.Message) error { return nil }
	m1, m2, m3 := msg(1), msg(2), msg(3)
	for i, c := range []struct {
		m    outbox.Message
		want inbox.Outcome
	}{{m1, inbox.Applied}, {m1, inbox.Duplicate}, {m3, inbox.Early}, {m2, inbox.Applied}, {m3, inbox.Applied}} {
		got, err := in.HandleMessage(ctx, c.m, apply)
		if err != nil || got != c.want {
			t.Errorf("consumer delivery %d (sequence %d): %v, %v; want %v", i, c.m.Sequence, got, err, c.want)
		}
	}
	if err := in.Seed(ctx, "order", "seeded", 5, "test"); err != nil {
		t.Errorf("consumer Seed: %v", err)
	}
	// The SQL inbox, as a consumer in another language calls it.
	for i, c := range []struct {
		seq  int64
		want string
	}{{1, "apply"}, {3, "early"}, {2, "apply"}, {2, "duplicate"}} {
		var answer string
		err := consumerDB.QueryRow(ctx, "SELECT "+schema+".inbox_claim('ledger', gen_random_uuid(), 'order', 'sql', $1, start_at_first_seen => true)", c.seq).Scan(&answer)
		if err != nil || answer != c.want {
			t.Errorf("consumer inbox_claim %d (sequence %d): %q, %v; want %s", i, c.seq, answer, err, c.want)
		}
	}
	if _, err := consumerDB.Exec(ctx, "SELECT "+schema+".inbox_seed('ledger', 'order', 'sql-seeded', 5, 'test')"); err != nil {
		t.Errorf("consumer inbox_seed: %v", err)
	}
	_, err = writerDB.Exec(ctx, "SELECT "+schema+".inbox_claim('ledger', gen_random_uuid(), 'order', 'w', 1)")
	refused(t, err, "writer calls inbox_claim")
	for what, stmt := range map[string]string{
		"consumer reads events":        "SELECT * FROM " + events,
		"consumer inserts an event":    "INSERT INTO " + events + " (event_id) VALUES (gen_random_uuid())",
		"consumer enqueues":            "SELECT " + schema + ".enqueue('order', 'x', 'T', '{}')",
		"consumer moves a counter":     "UPDATE " + aggregates + " SET last_sequence = 1",
		"consumer reads the audit log": "SELECT * FROM " + operations,
	} {
		_, err := consumerDB.Exec(ctx, stmt)
		refused(t, err, what)
	}

	stopRelay()
	if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("relay Run: %v", err)
	}
	relayDone <- nil // for the deferred stop
	warned.mu.Lock()
	defer warned.mu.Unlock()
	var failures []string
	for _, m := range warned.msgs {
		if !strings.HasPrefix(m, "event quarantined ") || !strings.Contains(m, "refused by the destination") {
			failures = append(failures, m) // the two quarantines are the test's
		}
	}
	if len(failures) > 0 {
		t.Errorf("the relay logged failures as its role:\n%s", strings.Join(failures, "\n"))
	}
}

func TestGrantsRefusesBadRoleNames(t *testing.T) {
	t.Parallel()
	if _, err := outboxmigrate.Grants("outbox", outboxmigrate.Roles{Relay: `x"; DROP TABLE t; --`}); err == nil {
		t.Fatal("Grants accepted a role name with quotes")
	}
	if _, err := outboxmigrate.Grants("bad schema", outboxmigrate.Roles{}); err == nil {
		t.Fatal("Grants accepted a bad schema name")
	}
	text, err := outboxmigrate.Grants("", outboxmigrate.Roles{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`TO "outbox_writer"`, `TO "outbox_relay"`, `TO "outbox_operator"`, `TO "outbox_consumer"`, `ON SCHEMA "outbox"`} {
		if !strings.Contains(text, want) {
			t.Errorf("default grants lack %q", want)
		}
	}
}
