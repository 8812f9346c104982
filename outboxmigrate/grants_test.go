package outboxmigrate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestGrantsLeastPrivilege applies the printed grants to three fresh login
// roles and runs each role's work as that role: what it needs works, what
// it does not need is refused.
func TestGrantsLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	roles := outboxmigrate.Roles{
		Writer:   outboxtest.UniqueName(t, "w"),
		Relay:    outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"),
	}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator} {
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
	writerDB, relayDB, operatorDB := as(roles.Writer), as(roles.Relay), as(roles.Operator)
	events := schema + ".outbox_events"

	// Writer: three events (the two last quarantined by hand below), then
	// notify; no reading the audit log, no settling events.
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var recs []outbox.Recorded
	err = pgx.BeginFunc(ctx, writerDB, func(tx pgx.Tx) error {
		var err error
		recs, err = w.InsertTx(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "a", Type: "Placed", Payload: []byte(`{"n":1}`)},
			outbox.Event{AggregateType: "order", AggregateID: "b", Type: "Placed", Payload: []byte(`{"n":2}`)},
			outbox.Event{AggregateType: "order", AggregateID: "c", Type: "Placed", Payload: []byte(`{"n":3}`)})
		if err != nil {
			return err
		}
		_, err = w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "d", Type: "Placed", Payload: []byte(`{"n":4}`)})
		return err
	})
	if err != nil {
		t.Fatalf("writer InsertTx: %v", err)
	}
	if err := w.Notify(ctx, writerDB); err != nil {
		t.Fatalf("writer Notify: %v", err)
	}
	_, err = writerDB.Exec(ctx, "SELECT * FROM "+schema+".outbox_operations")
	refused(t, err, "writer reads outbox_operations")
	_, err = writerDB.Exec(ctx, "UPDATE "+events+" SET published_at = now()")
	refused(t, err, "writer sets published_at")
	_, err = writerDB.Exec(ctx, "SELECT payload_bytes FROM "+events)
	refused(t, err, "writer reads payloads")

	if _, err := pool.Exec(ctx, "UPDATE "+events+" SET quarantined_at = now(), attempt_count = 20, last_error = 'refused' WHERE event_id = ANY($1)",
		[]any{recs[1].ID, recs[2].ID}); err != nil {
		t.Fatal(err)
	}

	// Relay: publishes to a real stream, with clean-up and a fast lane
	// sweep, and logs no failure; no audit log, no business table.
	// A server that fsyncs every write, seen through its monitoring
	// endpoint: the relay's durability check has nothing to warn about.
	nats := natstest.Embedded(t)
	js := natstest.JetStream(t, natstest.Connect(t, nats.ClientURL()))
	natsCfg := natstest.Config(t)
	natsCfg.MonitorURL = nats.MonitorURL()
	pub := natstest.Publisher(t, js, natsCfg)
	warned := &warnings{}
	relay, err := outbox.NewRelay(relayDB, outbox.RelayConfig{
		Publisher: pub, Schema: schema, Logger: slog.New(warned),
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
	streamMsgs := func() uint64 {
		s, err := js.Stream(ctx, natsCfg.Stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	outboxtest.Eventually(t, 15*time.Second, "the relay publishes the two due events", func() bool { return streamMsgs() == 2 })
	_, err = relayDB.Exec(ctx, "DELETE FROM "+schema+".outbox_operations")
	refused(t, err, "relay deletes from outbox_operations")
	_, err = relayDB.Exec(ctx, "SELECT * FROM "+schema+".orders")
	refused(t, err, "relay reads a business table")
	_, err = relayDB.Exec(ctx, "INSERT INTO "+events+" (event_id) VALUES (gen_random_uuid())")
	refused(t, err, "relay inserts an event")

	// Operator: status, quarantine list, retry (the relay then publishes
	// the event), skip, clean-up, inbox status; no writing events.
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
	if _, err := admin.Retry(ctx, recs[1].ID, "test"); err != nil {
		t.Errorf("operator Retry: %v", err)
	}
	if _, err := admin.Skip(ctx, recs[2].ID, "test", "least privilege test"); err != nil {
		t.Errorf("operator Skip: %v", err)
	}
	if _, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour, InboxOlderThan: time.Hour}); err != nil {
		t.Errorf("operator Cleanup: %v", err)
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
	_, err = operatorDB.Exec(ctx, "INSERT INTO "+events+" (event_id) VALUES (gen_random_uuid())")
	refused(t, err, "operator inserts an event")
	outboxtest.Eventually(t, 15*time.Second, "the relay publishes the retried event", func() bool { return streamMsgs() == 3 })
	var ops int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_operations").Scan(&ops); err != nil || ops != 2 {
		t.Errorf("audit log has %d rows (%v), want 2 (retry, skip)", ops, err)
	}

	stopRelay()
	if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("relay Run: %v", err)
	}
	relayDone <- nil // for the deferred stop
	warned.mu.Lock()
	defer warned.mu.Unlock()
	if len(warned.msgs) > 0 {
		t.Errorf("the relay logged failures as its role:\n%s", strings.Join(warned.msgs, "\n"))
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
	for _, want := range []string{`TO "outbox_writer"`, `TO "outbox_relay"`, `TO "outbox_operator"`, `ON SCHEMA "outbox"`} {
		if !strings.Contains(text, want) {
			t.Errorf("default grants lack %q", want)
		}
	}
}
