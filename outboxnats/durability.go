package outboxnats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

// defaultServerSync is how often nats-server fsyncs its file streams when
// its sync_interval is not set.
const defaultServerSync = 2 * time.Minute

var _ outbox.DurabilityChecker = (*Publisher)(nil)

// CheckDurability reports whether a message the stream acknowledged
// survives the loss of the server that acknowledged it. It implements
// outbox.DurabilityChecker; the relay calls it at start.
//
// JetStream acknowledges a publish once the stream stored it, which for a
// file stream means written to the operating system, not fsynced: by
// default a server fsyncs every two minutes (Jepsen, NATS 2.12.1, 2025). So
// the acknowledgement is durable when the stream has several replicas (a
// majority holds the message before the acknowledgement), or a single one
// on a server that fsyncs every write (sync_interval: always). It is not
// for a memory stream, a stream with persist_mode async (acknowledged
// before it is even written), or a single-replica file stream on a server
// that syncs on an interval. A client connection cannot see the server's
// sync setting: CheckDurability reads it from the server's monitoring
// endpoint (Config.MonitorURL, /varz) when given one, and otherwise
// reports a single-replica stream as not durable, saying so.
//
// It returns an error (marked outbox.Unavailable when the server cannot be
// reached) only when the stream's info could not be read.
func (p *Publisher) CheckDurability(ctx context.Context) (outbox.DurabilityReport, error) {
	if err := p.connected(); err != nil {
		return outbox.DurabilityReport{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.AckTimeout)
		defer cancel()
	}
	s, err := p.admin.Stream(ctx, p.cfg.Stream)
	if err != nil {
		return outbox.DurabilityReport{}, classifyAdmin(fmt.Errorf("outboxnats: durability: stream %s: %w", p.cfg.Stream, err))
	}
	return p.streamDurability(ctx, s.CachedInfo()), nil
}

// streamDurability judges a stream from its info and, for a single-replica
// file stream, its server's sync setting.
func (p *Publisher) streamDurability(ctx context.Context, info *jetstream.StreamInfo) outbox.DurabilityReport {
	c := info.Config
	name := c.Name
	report := func(durable bool, reason, format string, args ...any) outbox.DurabilityReport {
		return outbox.DurabilityReport{Destination: "nats", Durable: durable, Reason: reason, Summary: fmt.Sprintf(format, args...)}
	}
	replicas := max(c.Replicas, 1)
	switch {
	case c.Storage == jetstream.MemoryStorage:
		return report(false, "memory_storage",
			"stream %s keeps its messages in memory (storage: memory): a server restart loses acknowledged events; recreate it with storage: file", name)
	case c.PersistMode == jetstream.AsyncPersistMode:
		return report(false, "async_persist",
			"stream %s acknowledges messages before writing them (persist_mode: async): a server crash loses acknowledged events; set persist_mode: default", name)
	case replicas >= 2:
		return report(true, "replicated",
			"stream %s: file storage, %d replicas: an acknowledged event is held by a majority of them", name, replicas)
	}
	leader := ""
	if info.Cluster != nil {
		leader = info.Cluster.Leader
	}
	if p.cfg.MonitorURL == "" {
		return report(false, "sync_unknown",
			"stream %s has 1 replica and the relay cannot see whether its server fsyncs each write (nats-server's default: every 2 minutes): set sync_interval: always in the server's jetstream block and add monitor_url=http://<server>:8222 to the destination so the relay can check it, or use replicas: 3", name)
	}
	v, err := p.readVarz(ctx)
	switch {
	case err != nil:
		return report(false, "sync_unknown",
			"stream %s has 1 replica and its server's sync setting could not be read at monitor_url (%v): fix monitor_url, or use replicas: 3", name, err)
	case leader != "" && v.Name != leader:
		return report(false, "sync_unknown",
			"stream %s has 1 replica on server %s, but monitor_url answers for server %s: point monitor_url at %s, or use replicas: 3", name, leader, v.Name, leader)
	case v.JetStream.Config.SyncAlways:
		return report(true, "sync_always",
			"stream %s: file storage, 1 replica on server %s, which fsyncs every write before acknowledging it (sync_interval: always)", name, v.Name)
	}
	interval := time.Duration(v.JetStream.Config.SyncInterval)
	if interval <= 0 {
		interval = defaultServerSync
	}
	return report(false, "single_replica_unsynced",
		"stream %s has 1 replica on server %s, which fsyncs only every %s: a power loss or kernel crash loses the events it acknowledged since; set sync_interval: always in the server's jetstream block, or use replicas: 3", name, v.Name, interval)
}

// varz is the part of the server's /varz that CheckDurability reads.
type varz struct {
	Name      string `json:"server_name"`
	JetStream struct {
		Config struct {
			SyncInterval int64 `json:"sync_interval"` // nanoseconds
			SyncAlways   bool  `json:"sync_always"`
		} `json:"config"`
	} `json:"jetstream"`
}

// readVarz reads the monitoring endpoint's /varz.
func (p *Publisher) readVarz(ctx context.Context) (varz, error) {
	var v varz
	client := &http.Client{}
	if strings.HasPrefix(p.cfg.MonitorURL, "https:") && p.cfg.CAFile != "" {
		tc, err := tlsfiles.Files{CA: p.cfg.CAFile}.Config(nil)
		if err != nil {
			return v, err
		}
		client.Transport = &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(p.cfg.MonitorURL, "/")+"/varz", nil)
	if err != nil {
		return v, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET /varz: %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&v); err != nil {
		return v, fmt.Errorf("GET /varz: %w", err)
	}
	if v.Name == "" {
		return v, errors.New("GET /varz: no server_name: not a NATS monitoring endpoint")
	}
	return v, nil
}
