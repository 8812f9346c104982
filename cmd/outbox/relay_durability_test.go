package main

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/promrules"
)

// TestRelayWarnsWhenAckNotDurable runs `outbox relay` on a JetStream stream
// kept in memory, and on a file stream of a server that fsyncs every write
// (seen through monitor_url): for the first the relay logs one warning
// naming the setting to change, exports outbox_destination_ack_durable 0
// with the reason, and `outbox status` (text and --json, another process)
// shows the report from its heartbeat row; for the second, no warning, 1,
// and "durable".
func TestRelayWarnsWhenAckNotDurable(t *testing.T) {
	t.Parallel()
	server := natstest.Embedded(t)
	for _, c := range []struct {
		name    string
		storage jetstream.StorageType
		durable bool
		reason  string
		status  string
	}{
		{"memory stream", jetstream.MemoryStorage, false, "memory_storage", "NOT DURABLE (nats, relay %r): stream %s keeps its messages in memory (storage: memory)"},
		{"file stream, server syncs every write", jetstream.FileStorage, true, "sync_always", "durable (nats, relay %r): stream %s: file storage, 1 replica"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, schema := outboxtest.Schema(t)
			js := natstest.JetStream(t, natstest.Connect(t, server.ClientURL()))
			cfg := natstest.Config(t)
			natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.SubjectPrefix + ".>"}, Storage: c.storage}); err != nil {
				t.Fatal(err)
			}
			insertEvent(t, pool, schema, "o1", 1, "")
			dest := server.ClientURL() + "?stream=" + cfg.Stream + "&subject_prefix=" + cfg.SubjectPrefix +
				"&monitor_url=" + url.QueryEscape(server.MonitorURL())
			relay := startRelayProcess(t, "--schema", schema, "--destination", dest, "--metrics-addr", "127.0.0.1:0",
				"--poll-interval", "50ms", "--heartbeat-interval", "100ms")
			var addr string
			select {
			case addr = <-relay.addr:
			case err := <-relay.waitErr:
				t.Fatalf("relay exited: %v\n%s", err, relay.log())
			case <-time.After(60 * time.Second):
				t.Fatalf("relay did not report its metrics address:\n%s", relay.log())
			}
			outboxtest.Eventually(t, 60*time.Second, "the event is published and the relay's ack durability recorded", func() bool {
				var pending, recorded int
				_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL),
					(SELECT count(*) FROM `+schema+`.outbox_relays WHERE ack_durability IS NOT NULL)`).Scan(&pending, &recorded)
				return pending == 0 && recorded == 1
			})

			// The log: one warning, naming the setting, or none.
			log := relay.log()
			warnings := 0
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, "destination acknowledgement is not durable") {
					warnings++
					if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "reason="+c.reason) || !strings.Contains(line, "storage: file") {
						t.Errorf("warning line lacks level=WARN, the reason or the setting to change: %s", line)
					}
				}
			}
			if want := map[bool]int{false: 1, true: 0}[c.durable]; warnings != want {
				t.Errorf("%d not-durable warnings in the relay's log, want %d:\n%s", warnings, want, log)
			}

			// The metric.
			fams, err := promrules.Scrape("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			labels := map[string]string{"schema": schema, "destination": "nats", "reason": c.reason}
			if v, ok := promrules.Value(fams, "outbox_destination_ack_durable", labels); !ok || v != map[bool]float64{false: 0, true: 1}[c.durable] {
				t.Errorf("outbox_destination_ack_durable%v = %g (exported %v), want durable %v", labels, v, ok, c.durable)
			}

			// outbox status, text and JSON.
			stdout, stderr, code := runOutbox(t, nil, "status", "--schema", schema)
			var relayID string
			if err := pool.QueryRow(ctx, `SELECT relay_id FROM `+schema+`.outbox_relays`).Scan(&relayID); err != nil {
				t.Fatal(err)
			}
			want := "ack durability  " + strings.NewReplacer("%s", cfg.Stream, "%r", relayID).Replace(c.status)
			if code != 0 || !strings.Contains(stdout, want) {
				t.Errorf("outbox status (exit %d) lacks %q:\n%s%s", code, want, stdout, stderr)
			}
			stdout, stderr, code = runOutbox(t, nil, "status", "--schema", schema, "--json")
			var st outbox.Status
			if err := json.Unmarshal([]byte(stdout), &st); code != 0 || err != nil {
				t.Fatalf("outbox status --json (exit %d): %v\n%s%s", code, err, stdout, stderr)
			}
			if len(st.Relays) != 1 || st.Relays[0].AckDurability == nil {
				t.Fatalf("status --json relays %+v: want one with ack_durability", st.Relays)
			}
			got := st.Relays[0].AckDurability
			if !got.Checked || got.Durable != c.durable || got.Reason != c.reason || got.Destination != "nats" || got.CheckedAt.IsZero() {
				t.Errorf("status --json ack_durability %+v, want checked, durable %v, reason %s", *got, c.durable, c.reason)
			}
		})
	}
}
