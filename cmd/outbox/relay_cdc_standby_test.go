package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestRelayCDCStandbyIsQuietAndTakesOver runs two `outbox relay --mode
// cdc` processes of one group on a private cluster whose logging is at
// PostgreSQL's defaults (log_min_messages, log_min_error_statement). The
// standby waits about ten seconds, looking at the slot twice a second, and
// adds no ERROR line to the server's log (it used to fail a
// START_REPLICATION each time). Then the streaming process is killed
// (SIGKILL) and the standby streams the slot soon after; then the new
// streaming process's connection is killed (pg_terminate_backend of its WAL
// sender) while the first one, restarted, stands by, and one of them
// streams again soon after. Both times are logged (docs/operations.md
// states them); events written at the end are published.
func TestRelayCDCStandbyIsQuietAndTakesOver(t *testing.T) {
	t.Parallel()
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: map[string]string{"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const schema = "cdc_standby"
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	js := natstest.JetStream(t, natstest.Conn(t))
	ncfg := natstest.Config(t)
	natstest.DeleteStreamAtCleanup(t, js, ncfg.Stream)
	start := func(id string) (*relayProcess, string) {
		p := startRelayProcess(t, "--database-url", c.URL(""), "--mode", "cdc", "--schema", schema, "--id", id,
			"--destination", outboxtest.NATSURL(), "--nats-stream", ncfg.Stream, "--nats-subject-prefix", ncfg.SubjectPrefix,
			"--metrics-addr", "127.0.0.1:0", "--poll-interval", "50ms")
		select {
		case addr := <-p.addr:
			return p, addr
		case err := <-p.waitErr:
			t.Fatalf("relay %s exited: %v\n%s", id, err, p.log())
		case <-time.After(60 * time.Second):
			t.Fatalf("relay %s did not report its metrics address:\n%s", id, p.log())
		}
		return nil, ""
	}
	metric := func(addr, name string) float64 {
		fams, err := promrules.Scrape("http://" + addr + "/metrics")
		if err != nil {
			return -1
		}
		v, ok := promrules.Value(fams, name, map[string]string{"schema": schema})
		if !ok {
			return -1
		}
		return v
	}
	slot := outboxcdc.SlotName(schema, outboxcdc.GroupDefault)
	activePID := func() int {
		var pid *int32
		if err := pool.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if pid == nil {
			return 0
		}
		return int(*pid)
	}
	errorLines := func(log string) []string {
		var out []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "ERROR:") {
				out = append(out, l)
			}
		}
		return out
	}

	a, addrA := start("relay-a")
	outboxtest.Eventually(t, 60*time.Second, "relay-a streams", func() bool { return metric(addrA, "outbox_cdc_streaming") == 1 })
	b, addrB := start("relay-b")
	outboxtest.Eventually(t, 60*time.Second, "relay-b stands by", func() bool { return metric(addrB, "outbox_cdc_standing_by") == 1 })
	from := len(c.Log())
	outboxtest.Eventually(t, 60*time.Second, "relay-b looked at the slot 20 times (about 10 s)", func() bool {
		return metric(addrB, "outbox_cdc_standby_checks_total") >= 20
	})
	if errs := errorLines(c.Log()[from:]); len(errs) > 0 {
		t.Fatalf("the standby added %d ERROR lines to PostgreSQL's log while it waited:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	if metric(addrA, "outbox_cdc_streaming") != 1 || metric(addrB, "outbox_cdc_streaming") != 0 {
		t.Fatalf("relay-a streaming %g, relay-b %g; want a only", metric(addrA, "outbox_cdc_streaming"), metric(addrB, "outbox_cdc_streaming"))
	}

	// The streaming process dies.
	oldPID := activePID()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	outboxtest.Eventually(t, 60*time.Second, "the slot streamed again after relay-a was killed", func() bool {
		p := activePID()
		return p != 0 && p != oldPID
	})
	afterKill := time.Since(killed)
	outboxtest.Eventually(t, 30*time.Second, "relay-b streams", func() bool { return metric(addrB, "outbox_cdc_streaming") == 1 })
	if v := metric(addrB, "outbox_cdc_takeovers_total"); v != 1 {
		t.Errorf("relay-b counted %g takeovers, want 1", v)
	}

	// The streaming process's connection is killed while another process
	// stands by.
	_, addrA2 := start("relay-a2")
	outboxtest.Eventually(t, 60*time.Second, "relay-a2 stands by", func() bool { return metric(addrA2, "outbox_cdc_standing_by") == 1 })
	oldPID = activePID()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", oldPID); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	outboxtest.Eventually(t, 60*time.Second, "the slot streamed again after its WAL sender was terminated", func() bool {
		p := activePID()
		return p != 0 && p != oldPID
	})
	afterCut := time.Since(cut)
	who := "relay-b (reconnected)"
	if metric(addrA2, "outbox_cdc_streaming") == 1 {
		who = "relay-a2 (the standby)"
	}
	t.Logf("slot streamed again %s after the streaming relay was killed (SIGKILL), %s after its WAL sender was terminated (by %s); loaded 2-core machine",
		afterKill.Round(time.Millisecond), afterCut.Round(time.Millisecond), who)

	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o1", Type: "Step", Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.Eventually(t, 60*time.Second, "the events published after the takeovers", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&n)
		return n == 0
	})
	_ = b
}
