package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/outboxnats"
)

func init() {
	registerDestination(destinationKind{name: "nats", schemes: []string{"nats", "tls"}, open: openNATS})
}

// natsDestination is a JetStream stream and subject prefix of the run's
// own, on a Broker of the run's own (restartable) or an external server.
type natsDestination struct {
	broker *Broker // nil on an external server
	url    string
	stream string
	prefix string
	nc     *nats.Conn
	js     jetstream.JetStream
}

func openNATS(ctx context.Context, cfg DestinationConfig, url string) (Destination, error) {
	d := &natsDestination{url: url, stream: strings.ToUpper(cfg.Tag), prefix: cfg.Tag}
	if url == "" {
		var err error
		if d.broker, err = NewBroker(cfg.NATSServer, cfg.Dir, cfg.Sink); err != nil {
			return nil, err
		}
		if err := d.broker.Start(ctx); err != nil {
			return nil, err
		}
		d.url = d.broker.URL()
	}
	if err := d.connect(ctx, cfg.DuplicateWindow); err != nil {
		_ = d.Close(false)
		return nil, err
	}
	return d, nil
}

// connect connects the harness's client (reconnecting across broker
// restarts) and creates the stream up front.
func (d *natsDestination) connect(ctx context.Context, window time.Duration) error {
	var err error
	d.nc, err = nats.Connect(d.url, nats.Name("outbox-chaos"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", outboxnats.Redact(d.url), err)
	}
	if d.js, err = jetstream.New(d.nc); err != nil {
		return err
	}
	_, err = outboxnats.NewPublisher(ctx, d.js, outboxnats.Config{Stream: d.stream, SubjectPrefix: d.prefix, DuplicateWindow: window})
	return err
}

func (d *natsDestination) Name() string { return "nats" }

func (d *natsDestination) Describe() string {
	shown := outboxnats.Redact(d.url)
	where := "NATS at " + shown
	if d.broker != nil {
		where = "JetStream " + d.broker.Kind() + " at " + shown
		if d.broker.Kind() == "embedded" {
			where = "embedded JetStream at " + shown
		}
	}
	return fmt.Sprintf("%s, stream %s, subjects %s.>", where, d.stream, d.prefix)
}

// URL is the server's URL; on a broker of the run's own it names the
// server's monitoring endpoint too (monitor_url), so that the relays can see
// how it syncs (outboxnats.Publisher.CheckDurability).
func (d *natsDestination) URL() string {
	if d.broker != nil {
		return d.url + "?monitor_url=" + d.broker.MonitorURL()
	}
	return d.url
}

func (d *natsDestination) Args(string) []string {
	return []string{"--nats-stream", d.stream, "--nats-subject-prefix", d.prefix}
}

func (d *natsDestination) Restartable() bool { return d.broker != nil }

func (d *natsDestination) Stop() error {
	if d.broker == nil {
		return errNotRestartable(d)
	}
	return d.broker.Stop()
}

func (d *natsDestination) Start(ctx context.Context) error {
	if d.broker == nil {
		return nil
	}
	return d.broker.Start(ctx)
}

func (d *natsDestination) Restarts() int {
	if d.broker == nil {
		return 0
	}
	return d.broker.Restarts()
}

// Messages reads the stream's order subjects in stream order with an
// ordered consumer.
func (d *natsDestination) Messages(ctx context.Context) ([]outbox.Message, error) {
	s, err := d.js.Stream(ctx, d.stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", d.stream, err)
	}
	filter := outboxnats.AggregateTypeFilter(d.prefix, orderevents.AggregateType)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", d.stream, err)
	}
	want := 0
	for _, n := range info.State.Subjects {
		want += int(n)
	}
	var out []outbox.Message
	if want == 0 {
		return out, nil
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", d.stream, err)
	}
	for len(out) < want {
		batch, err := oc.Fetch(min(want-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", d.stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			msg, err := outboxnats.Decode(m.Headers(), m.Data())
			if err != nil {
				return nil, fmt.Errorf("message on %s does not decode: %w", m.Subject(), err)
			}
			out = append(out, msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("read stream %s: %w", d.stream, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("read stream %s: got %d of %d messages", d.stream, len(out), want)
		}
	}
	return out, nil
}

// Progress is the durable consumer's pending and ack-pending counts and its
// deliveries.
func (d *natsDestination) Progress(ctx context.Context, consumer string) (ConsumerProgress, error) {
	c, err := d.js.Consumer(ctx, d.stream, consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return ConsumerProgress{}, nil
	}
	if err != nil {
		return ConsumerProgress{}, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return ConsumerProgress{}, err
	}
	return ConsumerProgress{Exists: true, Pending: int64(info.NumPending), InFlight: int64(info.NumAckPending),
		Deliveries: int64(info.Delivered.Consumer)}, nil
}

// Close deletes the stream from an external server unless keep, and stops
// an own broker.
func (d *natsDestination) Close(keep bool) error {
	var err error
	if d.broker == nil && !keep && d.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if derr := d.js.DeleteStream(ctx, d.stream); derr != nil && !errors.Is(derr, jetstream.ErrStreamNotFound) {
			err = fmt.Errorf("delete stream %s: %w", d.stream, derr)
		}
		cancel()
	}
	if d.nc != nil {
		d.nc.Close()
	}
	if d.broker != nil {
		err = errors.Join(err, d.broker.Stop())
	}
	return err
}
