package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/outboxkafka"
)

func init() {
	registerDestination(destinationKind{name: "kafka", schemes: []string{"kafka"}, open: openKafka})
}

// kafkaDestination is a topic of the run's own on an external Kafka
// cluster, or on franz-go's in-process Kafka-protocol cluster (kfake)
// listening on a fixed port, since no Kafka server runs where this is
// developed. Nothing else here depends on kfake: the processes and the
// harness's clients speak the Kafka protocol to whatever listens.
//
// The in-process cluster persists to the run's directory (kfake.DataDir,
// with SyncWrites, so an acknowledged record is on disk), which makes it
// restartable on its port: a run on it has broker faults like a run on
// NATS. Without a directory it is in memory and not restartable. An
// external cluster is not restarted by the harness.
type kafkaDestination struct {
	mu       sync.Mutex
	fake     *kfake.Cluster // nil on an external cluster, or while stopped
	fakeOpts []kfake.Opt    // to start it again, on the same port and data
	runs     int            // starts of the in-process cluster
	// persisted: the in-process cluster keeps its data in cfg.Dir, so it
	// can be restarted (without a Dir it is in memory, not restartable).
	persisted bool
	url       string // with the topic template
	brokers   []string
	topic     string
	cl        *kgo.Client
	adm       *kadm.Client
}

func openKafka(ctx context.Context, cfg DestinationConfig, rawURL string) (Destination, error) {
	d := &kafkaDestination{}
	if rawURL == "" {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		d.fakeOpts = []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.GroupMinSessionTimeout(time.Second)}
		if cfg.Dir != "" {
			d.fakeOpts = append(d.fakeOpts, kfake.DataDir(filepath.Join(cfg.Dir, "kafka")), kfake.SyncWrites())
			d.persisted = true
		}
		if d.fake, err = kfake.NewCluster(d.fakeOpts...); err != nil {
			return nil, fmt.Errorf("start kfake on port %d: %w", port, err)
		}
		d.runs = 1
		rawURL = "kafka://127.0.0.1:" + strconv.Itoa(port)
	}
	pcfg, err := outboxkafka.ParseURL(rawURL)
	if err != nil {
		d.closeFake()
		return nil, err
	}
	if pcfg.Topic == "" {
		// The run's own topic: <tag>.{aggregate_type}.
		pcfg.Topic = cfg.Tag + "." + outboxkafka.AggregateTypePlaceholder
		sep := "?"
		if strings.Contains(rawURL, "?") {
			sep = "&"
		}
		rawURL += sep + "topic=" + url.QueryEscape(pcfg.Topic)
	}
	d.url, d.brokers = rawURL, pcfg.Brokers
	if d.topic, err = outboxkafka.Topic(pcfg.Topic, orderevents.AggregateType); err != nil {
		d.closeFake()
		return nil, err
	}
	if d.cl, err = kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.ClientID("outbox-chaos")); err != nil {
		d.closeFake()
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	d.adm = kadm.NewClient(d.cl)
	resp, err := d.adm.CreateTopic(ctx, int32(cfg.Partitions), 1, nil, d.topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		_ = d.Close(true)
		return nil, fmt.Errorf("create topic %s: %w", d.topic, err)
	}
	return d, nil
}

func (d *kafkaDestination) closeFake() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fake != nil {
		d.fake.Close()
		d.fake = nil
	}
}

func (d *kafkaDestination) Name() string { return "kafka" }

func (d *kafkaDestination) Describe() string {
	where := "Kafka at " + strings.Join(d.brokers, ",")
	switch {
	case d.persisted:
		where = "in-process Kafka (franz-go kfake, persisted to disk) at " + strings.Join(d.brokers, ",")
	case d.fakeOpts != nil:
		where = "in-process Kafka (franz-go kfake, in memory) at " + strings.Join(d.brokers, ",")
	}
	return where + ", topic " + d.topic
}

func (d *kafkaDestination) URL() string { return d.url }

func (d *kafkaDestination) Args(role string) []string {
	if role == RoleConsumer {
		// A killed consumer's partitions move on after this long.
		return []string{"--session-timeout", "3s"}
	}
	return nil
}

func (d *kafkaDestination) Restartable() bool { return d.persisted }

// Stop shuts the in-process cluster down (its data stays on disk).
func (d *kafkaDestination) Stop() error {
	if !d.persisted {
		return errNotRestartable(d)
	}
	d.closeFake()
	return nil
}

// Start starts the in-process cluster again on its port, with its data.
func (d *kafkaDestination) Start(context.Context) error {
	if !d.persisted {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fake != nil {
		return nil
	}
	c, err := kfake.NewCluster(d.fakeOpts...)
	if err != nil {
		return fmt.Errorf("start kfake again: %w", err)
	}
	d.fake = c
	d.runs++
	return nil
}

func (d *kafkaDestination) Restarts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.runs-1, 0)
}

// Messages reads every record of the topic, partition by partition in
// offset order, from the start offsets to the end offsets listed first.
func (d *kafkaDestination) Messages(ctx context.Context) ([]outbox.Message, error) {
	starts, err := d.adm.ListStartOffsets(ctx, d.topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("topic %s: start offsets: %w", d.topic, err)
	}
	ends, err := d.adm.ListEndOffsets(ctx, d.topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("topic %s: end offsets: %w", d.topic, err)
	}
	from := map[int32]kgo.Offset{}
	want := map[int32]int64{} // partition -> end offset
	remaining := 0
	ends.Each(func(o kadm.ListedOffset) {
		start, _ := starts.Lookup(d.topic, o.Partition)
		if o.Offset > start.Offset {
			from[o.Partition] = kgo.NewOffset().At(start.Offset)
			want[o.Partition] = o.Offset
			remaining++
		}
	})
	var out []outbox.Message
	if remaining == 0 {
		return out, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.ClientID("outbox-chaos-reader"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{d.topic: from}))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	byPartition := map[int32][]outbox.Message{}
	for remaining > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return nil, fmt.Errorf("read topic %s: %d partitions not read to their end: %w", d.topic, remaining, err)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			ferr = fmt.Errorf("read topic %s partition %d: %w", d.topic, p, err)
		})
		if ferr != nil {
			return nil, ferr
		}
		for _, r := range fs.Records() {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				continue
			}
			m, err := outboxkafka.Decode(r)
			if err != nil {
				return nil, fmt.Errorf("record %s/%d@%d does not decode: %w", r.Topic, r.Partition, r.Offset, err)
			}
			byPartition[r.Partition] = append(byPartition[r.Partition], m)
			if r.Offset == end-1 {
				remaining--
			}
		}
	}
	parts := make([]int32, 0, len(byPartition))
	for p := range byPartition {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	for _, p := range parts {
		out = append(out, byPartition[p]...)
	}
	return out, nil
}

// Progress is the group's lag: the topic's end offsets minus the group's
// committed offsets (the start offsets where it committed none).
func (d *kafkaDestination) Progress(ctx context.Context, group string) (ConsumerProgress, error) {
	committed, err := d.adm.FetchOffsets(ctx, group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return ConsumerProgress{}, fmt.Errorf("group %s: committed offsets: %w", group, err)
	}
	starts, err := d.adm.ListStartOffsets(ctx, d.topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return ConsumerProgress{}, fmt.Errorf("topic %s: start offsets: %w", d.topic, err)
	}
	ends, err := d.adm.ListEndOffsets(ctx, d.topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return ConsumerProgress{}, fmt.Errorf("topic %s: end offsets: %w", d.topic, err)
	}
	p := ConsumerProgress{Exists: true, Deliveries: -1}
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if s, ok := starts.Lookup(d.topic, o.Partition); ok {
			at = s.Offset
		}
		if c, ok := committed.Lookup(d.topic, o.Partition); ok && c.At >= 0 {
			at = c.At
		}
		p.Pending += max(o.Offset-at, 0)
	})
	return p, nil
}

// Close deletes the topic from an external cluster unless keep, and stops
// an own kfake cluster.
func (d *kafkaDestination) Close(keep bool) error {
	var err error
	if d.fakeOpts == nil && !keep && d.adm != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, derr := d.adm.DeleteTopic(ctx, d.topic)
		if derr == nil {
			derr = resp.Err
		}
		cancel()
		if derr != nil {
			err = fmt.Errorf("delete topic %s: %w", d.topic, derr)
		}
	}
	if d.cl != nil {
		d.cl.Close()
	}
	d.closeFake()
	return errors.Join(err)
}
