package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestRelayCDCKilledAtEachBoundary runs `outbox relay --mode cdc` on a
// private cluster with wal_level=logical, kills it with SIGKILL at a
// boundary of the CDC path, and starts it again. The slot was not confirmed
// past the events the killed process had not finished with; the restarted
// relay reads them again from the slot and publishes every event, each
// aggregate in order (first deliveries), with nothing lost.
//
// In the first two cases the safety net's threshold is an hour, so the
// restarted relay's CDC path alone publishes the events: the replay from
// the slot is what is tested. After ack before mark the events stay leased
// by the dead process; the CDC path leaves them and the safety net (2s)
// republishes them once the lease expired: duplicates at the broker.
func TestRelayCDCKilledAtEachBoundary(t *testing.T) {
	t.Parallel()
	cases := []struct {
		failpoint, reconcileAfter string
		wantDuplicates            bool
	}{
		{"cdc/before-publish", "1h", false},
		{"cdc/before-confirm", "1h", false},
		{"relay/after-ack-before-mark", "2s", true},
	}
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: map[string]string{"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)

	for i, tc := range cases {
		t.Run(tc.failpoint, func(t *testing.T) {
			schema := fmt.Sprintf("cdc_kill_%d", i)
			if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
				t.Fatal(err)
			}
			// The slot must exist before the events are written.
			if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: pool, Schema: schema}); err != nil {
				t.Fatal(err)
			}
			w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			const aggregates, txs = 4, 5
			var lsn string
			for i := 0; i < txs; i++ {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for a := 0; a < aggregates; a++ {
						ev := outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o%d", a), Type: fmt.Sprintf("Step%d", i), Payload: []byte(`{}`)}
						if _, err := w.InsertTx(ctx, tx, ev); err != nil {
							return err
						}
					}
					return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			last, _ := pglogrepl.ParseLSN(lsn)
			confirmed := func() pglogrepl.LSN {
				var s string
				if err := pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
					outboxcdc.SlotName(schema, outboxcdc.GroupDefault)).Scan(&s); err != nil {
					t.Fatal(err)
				}
				l, _ := pglogrepl.ParseLSN(s)
				return l
			}

			stream, prefix := "S_"+outboxtest.UniqueName(t, "k"), outboxtest.UniqueName(t, "k")
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
			relayCmd := func(failpoints string) *exec.Cmd {
				cmd := exec.Command(outboxBinary(t), "relay", "--mode", "cdc", "--reconcile-after", tc.reconcileAfter,
					"--schema", schema, "--destination", outboxtest.NATSURL(),
					"--nats-stream", stream, "--nats-subject-prefix", prefix, "--nats-duplicate-window", "100ms",
					"--lease", "1s", "--poll-interval", "50ms", "--retry-min", "50ms")
				cmd.Env = append(os.Environ(), "DATABASE_URL="+c.URL(""), "OUTBOX_FAILPOINTS="+failpoints)
				cmd.Stderr = &testWriter{t: t}
				return cmd
			}
			runCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
			defer cancel()
			killed := relayCmd(tc.failpoint + "=crash")
			if err := killed.Start(); err != nil {
				t.Fatal(err)
			}
			waitErr := waitCmd(runCtx, killed)
			var exitErr *exec.ExitError
			if !errors.As(waitErr, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("relay with the crash failpoint ended with %v, want killed by SIGKILL", waitErr)
			}
			if got := confirmed(); got > last {
				t.Fatalf("slot confirmed at %s, past the last event's commit (%s), by a process killed before it was done with them", got, last)
			}

			restarted := relayCmd("")
			if err := restarted.Start(); err != nil {
				t.Fatal(err)
			}
			outboxtest.Eventually(t, 60*time.Second, "all events published after the restart", func() bool {
				var n int
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&n)
				return n == 0
			})
			outboxtest.Eventually(t, 30*time.Second, "slot confirmed past the last event", func() bool { return confirmed() > last })
			_ = restarted.Process.Signal(syscall.SIGTERM)
			if err := waitCmd(runCtx, restarted); err != nil {
				t.Fatalf("relay did not shut down cleanly on SIGTERM: %v", err)
			}

			s, err := js.Stream(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			info, _ := s.Info(ctx)
			next := map[string]int64{}
			seen := map[uuid.UUID]int{}
			dups := 0
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
				raw, err := s.GetMsg(ctx, seq)
				if err != nil {
					t.Fatal(err)
				}
				m, err := outboxnats.Decode(raw.Header, raw.Data)
				if err != nil {
					t.Fatal(err)
				}
				if seen[m.ID]++; seen[m.ID] > 1 {
					dups++
					continue
				}
				if m.Sequence != next[m.AggregateID]+1 {
					t.Fatalf("I5 violated: %s sequence %d first delivered after %d", m.AggregateID, m.Sequence, next[m.AggregateID])
				}
				next[m.AggregateID] = m.Sequence
			}
			if len(seen) != aggregates*txs {
				t.Fatalf("%d distinct events at the broker, want %d", len(seen), aggregates*txs)
			}
			if tc.wantDuplicates != (dups > 0) {
				t.Fatalf("%d duplicates at the broker; want duplicates: %v", dups, tc.wantDuplicates)
			}
		})
	}
}

// TestRelayCDCNeedsLogicalWAL: on the shared server (wal_level=replica) the
// cdc mode stops at once with one line saying what to set.
func TestRelayCDCNeedsLogicalWAL(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	stream := "S_" + outboxtest.UniqueName(t, "w")
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	cmd := exec.Command(outboxBinary(t), "relay", "--mode", "cdc", "--schema", schema, "--destination", outboxtest.NATSURL(),
		"--nats-stream", stream, "--nats-subject-prefix", outboxtest.UniqueName(t, "w"))
	cmd.Env = append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "wal_level = logical") {
		t.Fatalf("outbox relay --mode cdc on a wal_level=replica server: %v\n%s\nwant an error saying to set wal_level = logical", err, out)
	}
}

// TestRelayCDCMetricsAndStatus runs `outbox relay --mode cdc --metrics-addr`
// on a private cluster: the scrape shows the slot streamed and the events
// the CDC path published, and, while a transaction that wrote something
// stays open, the WAL a takeover would decode again (in `outbox status` and
// its --json too); every series the CDC alert rules use is exported, the
// not-streamed alert fires only once the relay stopped (checked through
// `outbox status`, which lists the slot, streamed or not).
func TestRelayCDCMetricsAndStatus(t *testing.T) {
	t.Parallel()
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: map[string]string{"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const schema = "cdc_metrics"
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	js := natstest.JetStream(t, natstest.Conn(t))
	ncfg := natstest.Config(t)
	natstest.DeleteStreamAtCleanup(t, js, ncfg.Stream)
	relay := startRelayProcess(t, "--database-url", c.URL(""), "--mode", "cdc", "--schema", schema,
		"--destination", outboxtest.NATSURL(), "--nats-stream", ncfg.Stream, "--nats-subject-prefix", ncfg.SubjectPrefix,
		"--metrics-addr", "127.0.0.1:0", "--poll-interval", "50ms")
	var addr string
	select {
	case addr = <-relay.addr:
	case err := <-relay.waitErr:
		t.Fatalf("relay exited: %v\n%s", err, relay.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not report its metrics address:\n%s", relay.log())
	}
	slot := outboxcdc.SlotName(schema, outboxcdc.GroupDefault)
	labels := map[string]string{"schema": schema, "slot": slot}
	var fams map[string]*dto.MetricFamily
	outboxtest.Eventually(t, 60*time.Second, "the relay streams its slot", func() bool {
		fams, err = promrules.Scrape("http://" + addr + "/metrics")
		v, ok := promrules.Value(fams, "outbox_cdc_slot_active", labels)
		return err == nil && ok && v == 1
	})
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	// A transaction that wrote something stays open while the stream
	// publishes and confirms past it: it holds the slot's restart_lsn back,
	// and a takeover would decode the WAL since then again.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.filler (pad text)`); err != nil {
		t.Fatal(err)
	}
	pin, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pin.Rollback(ctx) }()
	if _, err := pin.Exec(ctx, `SELECT txid_current(); INSERT INTO `+schema+`.filler VALUES ('pin')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.filler SELECT repeat('x', 100) FROM generate_series(1, 50000); CHECKPOINT`); err != nil {
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
	outboxtest.Eventually(t, 60*time.Second, "the CDC path published the 5 events", func() bool {
		fams, err = promrules.Scrape("http://" + addr + "/metrics")
		v, _ := promrules.Value(fams, "outbox_cdc_events_published_total", map[string]string{"schema": schema})
		return err == nil && v == 5
	})
	outboxtest.Eventually(t, 60*time.Second, "the scrape shows the WAL a takeover would decode again", func() bool {
		fams, err = promrules.Scrape("http://" + addr + "/metrics")
		v, _ := promrules.Value(fams, "outbox_cdc_slot_redecode_bytes", labels)
		return err == nil && v > 2<<20
	})
	if v, ok := promrules.Value(fams, "outbox_cdc_streaming", map[string]string{"schema": schema}); !ok || v != 1 {
		t.Errorf("outbox_cdc_streaming = %g (found %v), want 1", v, ok)
	}
	if v, ok := promrules.Value(fams, "outbox_cdc_slot_wal_status", map[string]string{"schema": schema, "slot": slot, "status": "reserved"}); !ok || v != 1 {
		t.Errorf("outbox_cdc_slot_wal_status{status=reserved} = %g (found %v), want 1", v, ok)
	}
	exported := promrules.Exported(fams)
	groups, err := promrules.Load("../../deploy/prometheus/outbox-cdc-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]string{}
	for _, g := range groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
			series, err := promrules.Series(r.Expr)
			if err != nil || len(series) == 0 {
				t.Fatalf("alert %s: %v (series %v)", r.Alert, err, series)
			}
			for _, name := range series {
				// safe_wal_bytes is absent while max_slot_wal_keep_size is unlimited.
				if !exported[name] && name != "outbox_cdc_slot_safe_wal_bytes" {
					t.Errorf("alert %s uses %s, which a cdc relay does not export", r.Alert, name)
				}
			}
		}
	}
	// safe_wal_bytes is absent while max_slot_wal_keep_size is unlimited,
	// lag_seconds while PostgreSQL measures no lag (idle).
	checkDashboard(t, "../../deploy/grafana/outbox-cdc-dashboard.json", 10, func(name string) bool {
		return exported[name] || name == "outbox_cdc_slot_safe_wal_bytes" || name == "outbox_cdc_slot_lag_seconds"
	})
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /readyz of a streaming cdc relay: %d, want 200", resp.StatusCode)
	}
	if got, err := promrules.Eval(alerts["OutboxCDCSlotNotStreamed"], fams); err != nil || len(got) != 0 {
		t.Errorf("OutboxCDCSlotNotStreamed on a streamed slot: %v, %v; want it silent", got, err)
	}

	status := func() string {
		out, err := exec.Command(outboxBinary(t), "status", "--database-url", c.URL(""), "--schema", schema).CombinedOutput()
		if err != nil {
			t.Fatalf("outbox status: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := status(); !strings.Contains(out, "CDC SLOT") || !strings.Contains(out, "REDECODE") || !regexp.MustCompile(slot+`\s+yes\s+reserved`).MatchString(out) {
		t.Errorf("outbox status does not show slot %s streamed with the WAL to decode again:\n%s", slot, out)
	}
	out, err := exec.Command(outboxBinary(t), "status", "--json", "--database-url", c.URL(""), "--schema", schema).CombinedOutput()
	if err != nil {
		t.Fatalf("outbox status --json: %v\n%s", err, out)
	}
	var st struct {
		CDCSlots []outboxcdc.SlotStatus `json:"cdc_slots"`
	}
	if err := json.Unmarshal(out, &st); err != nil || len(st.CDCSlots) != 1 || st.CDCSlots[0].RedecodeBytes <= 2<<20 {
		t.Errorf("outbox status --json: %+v, %v; want the slot with redecode_bytes over 2 MB\n%s", st.CDCSlots, err, out)
	}
	if err := pin.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := relay.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-relay.waitErr:
		if err != nil {
			t.Fatalf("relay did not stop cleanly on SIGTERM: %v\n%s", err, relay.log())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not stop on SIGTERM:\n%s", relay.log())
	}
	outboxtest.Eventually(t, 30*time.Second, "status shows the slot not streamed", func() bool {
		return regexp.MustCompile(slot + `\s+no\s+reserved.*no relay streams it`).MatchString(status())
	})
}
