package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/outboxprom"
)

const notDurableLog = `msg="destination acknowledgement is not durable`

// flakyChecker fails its first durability checks as unavailable, in front
// of the real publisher's.
type flakyChecker struct {
	*outboxnats.Publisher
	failures atomic.Int32
}

func (f *flakyChecker) CheckDurability(ctx context.Context) (outbox.DurabilityReport, error) {
	if f.failures.Add(-1) >= 0 {
		return outbox.DurabilityReport{}, outbox.Unavailable(errors.New("injected: broker not answering"))
	}
	return f.Publisher.CheckDurability(ctx)
}

// TestRelayChecksAckDurability: at start the relay asks its publisher what
// the destination's acknowledgement is worth and, when it is not durable,
// warns once: one log line naming the setting to change, the metric
// outbox_destination_ack_durable at 0 with the reason, and the report in
// its heartbeat row, which Admin.Status (outbox status) shows. A memory
// stream and a single-replica stream on a server that fsyncs every two
// minutes warn; the same stream on a server that fsyncs every write does
// not. A publisher that cannot tell is recorded as not checked, without a
// warning or a metric; a check that cannot reach the broker is retried.
func TestRelayChecksAckDurability(t *testing.T) {
	t.Parallel()
	lazy := natstest.EmbeddedWith(t, outboxnats.EmbeddedConfig{SyncInterval: 2 * time.Minute})
	always := natstest.Embedded(t)
	cases := []struct {
		name     string
		server   *outboxnats.Embedded
		storage  jetstream.StorageType
		failures int32 // checks failing before the real one
		checker  bool  // the publisher is a DurabilityChecker
		durable  bool
		reason   string
		fix      string
	}{
		{"memory stream", always, jetstream.MemoryStorage, 0, true, false, "memory_storage", "storage: file"},
		{"R1 file stream, server syncs every 2m", lazy, jetstream.FileStorage, 0, true, false, "single_replica_unsynced", "sync_interval: always"},
		{"R1 file stream, server syncs every write", always, jetstream.FileStorage, 0, true, true, "sync_always", ""},
		{"check fails twice, then memory stream", always, jetstream.MemoryStorage, 2, true, false, "memory_storage", "storage: file"},
		{"publisher cannot tell", always, jetstream.FileStorage, 0, false, false, outbox.AckNotChecked, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, schema := outboxtest.Schema(t)
			js := natstest.JetStream(t, natstest.Connect(t, c.server.ClientURL()))
			ncfg := natstest.Config(t)
			ncfg.MonitorURL = c.server.MonitorURL()
			natstest.DeleteStreamAtCleanup(t, js, ncfg.Stream)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ncfg.Stream, Subjects: []string{ncfg.SubjectPrefix + ".>"},
				Storage: c.storage}); err != nil {
				t.Fatal(err)
			}
			np := natstest.Publisher(t, js, ncfg)
			var pub outbox.Publisher = np
			switch {
			case !c.checker:
				pub = outbox.PublisherFunc(np.Publish)
			case c.failures > 0:
				f := &flakyChecker{Publisher: np}
				f.failures.Store(c.failures)
				pub = f
			}
			metrics, err := outboxprom.New(outboxprom.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(metrics)
			srv := httptest.NewServer(outboxprom.Handler(reg, nil))
			t.Cleanup(srv.Close)
			logs := new(syncBuffer)
			cfg := quietConfig(schema, pub)
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
			cfg.Observer = metrics
			cfg.HeartbeatInterval = 50 * time.Millisecond
			w := newWriter(t, schema)
			writeEvents(t, pool, w, 3, 2)
			relay, stop := startRelay(t, pool, cfg)
			admin := newAdmin(t, pool, schema)

			// The report reaches the heartbeat row (after the failed checks).
			var got *outbox.AckDurability
			outboxtest.Eventually(t, 30*time.Second, "the relay records its ack durability", func() bool {
				st, err := admin.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range st.Relays {
					if r.ID == relay.ID() && r.AckDurability != nil && r.AckDurability.Reason != outbox.AckCheckPending {
						got = r.AckDurability
					}
				}
				return got != nil
			})
			if got.Checked != c.checker || got.Durable != c.durable || got.Reason != c.reason {
				t.Fatalf("status: ack durability %+v, want checked %v durable %v reason %q", *got, c.checker, c.durable, c.reason)
			}
			if c.fix != "" && !strings.Contains(got.Summary, c.fix) {
				t.Errorf("status summary %q does not name %q", got.Summary, c.fix)
			}
			if a, ok := relay.AckDurability(); !ok || a.DurabilityReport != got.DurabilityReport {
				t.Errorf("Relay.AckDurability = %+v, %v; the heartbeat row says %+v", a, ok, *got)
			}
			// Publishing goes on, and more batches bring no more warnings.
			outboxtest.Eventually(t, 30*time.Second, "the first events are published", func() bool { return unpublished(t, pool, schema) == 0 })
			writeEvents(t, pool, w, 3, 2)
			outboxtest.Eventually(t, 30*time.Second, "the later events are published", func() bool { return unpublished(t, pool, schema) == 0 })

			fams, err := promrules.Scrape(srv.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			labels := map[string]string{"schema": schema, "destination": "nats", "reason": c.reason}
			v, ok := promrules.Value(fams, "outbox_destination_ack_durable", labels)
			switch {
			case !c.checker:
				if _, any := promrules.Value(fams, "outbox_destination_ack_durable", map[string]string{"schema": schema}); any {
					t.Error("outbox_destination_ack_durable exported for a publisher that cannot tell")
				}
			case !ok || v != map[bool]float64{true: 1, false: 0}[c.durable]:
				t.Errorf("outbox_destination_ack_durable%v = %g (exported %v), want %v", labels, v, ok, c.durable)
			}

			stop()
			out := logs.String()
			warnings := strings.Count(out, notDurableLog)
			switch {
			case c.checker && !c.durable:
				if warnings != 1 {
					t.Fatalf("%d not-durable warnings in the log, want exactly 1:\n%s", warnings, out)
				}
				for _, line := range strings.Split(out, "\n") {
					if strings.Contains(line, notDurableLog) && (!strings.Contains(line, "level=WARN") ||
						!strings.Contains(line, "reason="+c.reason) || !strings.Contains(line, c.fix)) {
						t.Errorf("warning line lacks level=WARN, reason=%s or %q: %s", c.reason, c.fix, line)
					}
				}
			case warnings != 0:
				t.Errorf("not-durable warning logged for a %s:\n%s", c.name, out)
			}
			if c.failures > 0 && strings.Count(out, "could not check what the destination's acknowledgement is worth") != 1 {
				t.Errorf("want one line about the failed checks:\n%s", out)
			}
		})
	}
}
