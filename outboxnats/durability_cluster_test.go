package outboxnats_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// jetStreamCluster starts three embedded servers forming a JetStream
// cluster, syncing on nats-server's default interval, and returns their
// client URLs and their monitoring URLs by server name; they are shut down
// when the test ends.
func jetStreamCluster(t *testing.T) ([]string, map[string]string) {
	t.Helper()
	ports := make([]int, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	var urls []string
	var servers []*natsserver.Server
	monitors := map[string]string{}
	for i, p := range ports {
		opts := &natsserver.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: natsserver.RANDOM_PORT,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true, SyncInterval: 2 * time.Minute,
			Cluster: natsserver.ClusterOpts{Name: "outbox-test", Host: "127.0.0.1", Port: p},
			Routes:  routes, HTTPHost: "127.0.0.1", HTTPPort: natsserver.RANDOM_PORT,
		}
		srv, err := natsserver.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		if !srv.ReadyForConnections(30 * time.Second) {
			t.Fatal("cluster server did not start")
		}
		urls = append(urls, srv.ClientURL())
		servers = append(servers, srv)
		monitors[opts.ServerName] = fmt.Sprintf("http://%s", srv.MonitorAddr())
	}
	outboxtest.Eventually(t, 60*time.Second, "the cluster elects a JetStream meta leader", func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				return true
			}
		}
		return false
	})
	return urls, monitors
}

// TestCheckDurabilityReplicated: on a cluster of servers that sync only
// every two minutes, a file stream with three replicas is durable (a
// majority holds each acknowledged message); one with a single replica is
// not: without monitor_url the relay cannot tell, with the monitoring
// endpoint of another server than the stream's it says so, and with its
// own server's it says how often that server syncs.
func TestCheckDurabilityReplicated(t *testing.T) {
	t.Parallel()
	urls, monitors := jetStreamCluster(t)
	js := natstest.JetStream(t, natstest.Connect(t, urls[0]))
	ctx := testCtx(t)
	create := func(replicas int) (jetstream.Stream, string, string) {
		cfg := natstest.Config(t)
		natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)
		var s jetstream.Stream
		var lastErr error
		// The cluster places the stream in its own time.
		outboxtest.Eventually(t, 60*time.Second, "the cluster creates the stream", func() bool {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var err error
			s, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.SubjectPrefix + ".>"},
				Storage: jetstream.FileStorage, Replicas: replicas})
			if err != nil && err != lastErr {
				t.Logf("create stream: %v", err)
			}
			lastErr = err
			return err == nil
		})
		return s, cfg.Stream, cfg.SubjectPrefix
	}
	check := func(stream, prefix, monitor string) (durable bool, reason, summary string) {
		t.Helper()
		p := natstest.Publisher(t, js, outboxnats.Config{Stream: stream, SubjectPrefix: prefix, MonitorURL: monitor})
		rep, err := p.CheckDurability(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s, monitor %q: %+v", stream, monitor, rep)
		return rep.Durable, rep.Reason, rep.Summary
	}

	_, r3, p3 := create(3)
	if durable, reason, _ := check(r3, p3, ""); !durable || reason != "replicated" {
		t.Errorf("R3: durable %v reason %q, want durable, replicated", durable, reason)
	}
	s1, r1, p1 := create(1)
	leader := s1.CachedInfo().Cluster.Leader
	other := ""
	for name := range monitors {
		if name != leader {
			other = name
		}
	}
	for _, c := range []struct {
		monitor, reason, mention string
	}{
		{"", "sync_unknown", "cannot see"},
		{monitors[other], "sync_unknown", "answers for server " + other},
		{monitors[leader], "single_replica_unsynced", "every 2m0s"},
	} {
		durable, reason, summary := check(r1, p1, c.monitor)
		if durable || reason != c.reason || !strings.Contains(summary, c.mention) {
			t.Errorf("R1 on %s, monitor %q: durable %v reason %q %q; want not durable, %s, mentioning %q",
				leader, c.monitor, durable, reason, summary, c.reason, c.mention)
		}
	}
}
