package outboxnats_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestCheckDurability: what a JetStream acknowledgement is worth, judged
// on real servers. A memory stream, a stream acknowledging before it writes
// (persist_mode async) and a single-replica file stream on a server that
// fsyncs every two minutes (nats-server's default) are not durable, nor is
// a single-replica stream whose server's sync setting the relay cannot see
// (no monitor_url, on the embedded and on the machine's server); on a
// server that fsyncs every write, seen through monitor_url, it is. Each
// warning names the setting to change.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	lazy := natstest.EmbeddedWith(t, outboxnats.EmbeddedConfig{SyncInterval: 2 * time.Minute})
	always := natstest.Embedded(t)
	check := func(t *testing.T, e *outboxnats.Embedded, create *jetstream.StreamConfig, monitor string) outbox.DurabilityReport {
		t.Helper()
		ctx := testCtx(t)
		var js jetstream.JetStream
		if e == nil {
			js = natstest.JetStream(t, natstest.Conn(t))
		} else {
			js = natstest.JetStream(t, natstest.Connect(t, e.ClientURL()))
		}
		cfg := natstest.Config(t)
		cfg.MonitorURL = monitor
		if create != nil {
			create.Name, create.Subjects = cfg.Stream, []string{cfg.SubjectPrefix + ".>"}
			natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)
			if _, err := js.CreateStream(ctx, *create); err != nil {
				t.Fatalf("create stream: %v", err)
			}
		}
		p := natstest.Publisher(t, js, cfg)
		rep, err := p.CheckDurability(ctx)
		if err != nil {
			t.Fatalf("CheckDurability: %v", err)
		}
		t.Logf("%+v", rep)
		if rep.Destination != "nats" || strings.Contains(rep.Summary, "\n") || !strings.Contains(rep.Summary, cfg.Stream) {
			t.Errorf("report %+v: want destination nats and one line naming stream %s", rep, cfg.Stream)
		}
		return rep
	}
	cases := []struct {
		name    string
		server  *outboxnats.Embedded // nil: the machine's server
		create  *jetstream.StreamConfig
		monitor string
		durable bool
		reason  string
		fix     string // the setting the summary names
	}{
		{"memory stream", always, &jetstream.StreamConfig{Storage: jetstream.MemoryStorage}, always.MonitorURL(), false, "memory_storage", "storage: file"},
		{"async persist", always, &jetstream.StreamConfig{Storage: jetstream.FileStorage, PersistMode: jetstream.AsyncPersistMode}, always.MonitorURL(), false, "async_persist", "persist_mode: default"},
		{"R1 file, lazy server", lazy, nil, lazy.MonitorURL(), false, "single_replica_unsynced", "sync_interval: always"},
		{"R1 file, sync unknown", always, nil, "", false, "sync_unknown", "monitor_url="},
		{"R1 file, machine's server, sync unknown", nil, nil, "", false, "sync_unknown", "sync_interval: always"},
		{"R1 file, server syncs every write", always, nil, always.MonitorURL(), true, "sync_always", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := check(t, c.server, c.create, c.monitor)
			if rep.Durable != c.durable || rep.Reason != c.reason {
				t.Fatalf("durable %v reason %q, want %v %q", rep.Durable, rep.Reason, c.durable, c.reason)
			}
			if c.fix != "" && !strings.Contains(rep.Summary, c.fix) {
				t.Errorf("summary %q does not name %q", rep.Summary, c.fix)
			}
		})
	}
	t.Run("lazy server says how often it syncs", func(t *testing.T) {
		t.Parallel()
		if rep := check(t, lazy, nil, lazy.MonitorURL()); !strings.Contains(rep.Summary, "every 2m0s") {
			t.Errorf("summary %q does not say the server fsyncs every 2m0s", rep.Summary)
		}
	})
	t.Run("monitor_url that is not NATS", func(t *testing.T) {
		t.Parallel()
		rep := check(t, always, nil, "http://"+always.ClientURL()[len("nats://"):]) // the client port: no HTTP there
		if rep.Durable || rep.Reason != "sync_unknown" || !strings.Contains(rep.Summary, "monitor_url") {
			t.Errorf("report %+v: want not durable, sync_unknown, naming monitor_url", rep)
		}
	})
}

// TestCheckDurabilityUnreachable: a check that cannot reach the server is
// an error marked unavailable (the relay tries again), not a report.
func TestCheckDurabilityUnreachable(t *testing.T) {
	t.Parallel()
	e := natstest.Embedded(t)
	nc := natstest.Connect(t, e.ClientURL())
	p := natstest.Publisher(t, natstest.JetStream(t, nc), outboxnats.Config{MonitorURL: e.MonitorURL()})
	e.Shutdown()
	outboxtest.Eventually(t, 30*time.Second, "the client sees the server gone", func() bool { return !nc.IsConnected() })
	if _, err := p.CheckDurability(testCtx(t)); !outbox.IsUnavailable(err) {
		t.Fatalf("CheckDurability with the server down: %v, want unavailable", err)
	}
}
