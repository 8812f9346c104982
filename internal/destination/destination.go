// Package destination opens the publisher named by a destination URL
// (OUTBOX_DESTINATION), for the binaries.
package destination

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/outboxkafka"
	"github.com/pgoutbox/outbox/outboxnats"
)

// Options are the destination flags.
type Options struct {
	URL               string
	NATSStream        string
	NATSSubjectPrefix string
	Source            string
	DuplicateWindow   time.Duration
}

// Register adds the destination flags to fs.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.URL, "destination", cli.Env("OUTBOX_DESTINATION", ""), "where events go: nats://host:port or tls://host:port[?stream=OUTBOX&subject_prefix=outbox&monitor_url=http://host:8222], kafka://[user@]host:port[,host:port][?topic=outbox.{aggregate_type}&sasl=scram-sha-512&tls=true] (SASL password in env OUTBOX_KAFKA_PASSWORD), amqp[s]://user@host:port/vhost[?exchange=outbox&routing_key=outbox.{aggregate_type}&check_queues=q1,q2] (password in the URL or env OUTBOX_AMQP_PASSWORD), or an http(s):// webhook URL (secret in env OUTBOX_WEBHOOK_SECRET). TLS: ca_file=ca.pem (instead of the system's roots), cert_file=client.pem&key_file=client.key (a client certificate) on nats/tls, kafka and amqps URLs, outbox_ca_file, outbox_cert_file, outbox_key_file on https ones; the files are read at start. monitor_url (the NATS server's monitoring endpoint) and check_queues (the RabbitMQ queues bound for the events) let the relay check at start that the broker's acknowledgement is durable (env OUTBOX_DESTINATION; secrets are never printed)")
	cli.RedactDefault(fs, "destination", Redact)
	o.RegisterNATS(fs)
	fs.DurationVar(&o.DuplicateWindow, "nats-duplicate-window", envDuration("OUTBOX_NATS_DUPLICATE_WINDOW", outboxnats.DuplicateWindowDefault), "JetStream dedup window for a stream this creates (env OUTBOX_NATS_DUPLICATE_WINDOW)")
	fs.StringVar(&o.Source, "source", cli.Env("OUTBOX_SOURCE", outboxnats.SourceDefault), "CloudEvents source attribute (env OUTBOX_SOURCE)")
}

// RegisterNATS adds only the NATS stream and subject flags (for consumers).
func (o *Options) RegisterNATS(fs *flag.FlagSet) {
	fs.StringVar(&o.NATSStream, "nats-stream", cli.Env("OUTBOX_NATS_STREAM", outboxnats.StreamDefault), "JetStream stream name (env OUTBOX_NATS_STREAM)")
	fs.StringVar(&o.NATSSubjectPrefix, "nats-subject-prefix", cli.Env("OUTBOX_NATS_SUBJECT_PREFIX", outboxnats.SubjectPrefixDefault), "subject prefix of the events (env OUTBOX_NATS_SUBJECT_PREFIX)")
}

// NATSConfig is the outboxnats configuration the options describe.
func (o *Options) NATSConfig() outboxnats.Config {
	return outboxnats.Config{Stream: o.NATSStream, SubjectPrefix: o.NATSSubjectPrefix, Source: o.Source, DuplicateWindow: o.DuplicateWindow}
}

// ConnectNATS connects to the NATS server of a destination URL (nats:// or
// tls://, with its TLS files: ca_file, cert_file, key_file) and keeps
// reconnecting forever, so a broker restart is an outage, not the end of
// the process.
func ConnectNATS(rawURL, name string) (*nats.Conn, error) {
	server, cfg, err := outboxnats.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return connectNATS(server, cfg, name)
}

func connectNATS(server string, cfg outboxnats.Config, name string) (*nats.Conn, error) {
	opts, err := cfg.ConnectOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true), nats.Timeout(5*time.Second))
	nc, err := nats.Connect(server, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", outboxnats.Redact(server), err)
	}
	return nc, nil
}

// Open returns the publisher for o.URL and a function that closes it. An
// unreachable destination is an error.
func Open(ctx context.Context, o Options) (outbox.Publisher, func(), error) {
	return OpenWait(ctx, o, nil)
}

// OpenWait is Open that waits for an unreachable destination: each time the
// destination cannot be reached (an error marked outbox.Unavailable), it
// calls retry, which pauses (logging why) and returns nil to try again, or
// returns an error (ctx's, when it ended) that OpenWait returns. Any other
// error (a bad URL, an incompatible stream) is returned at once. A nil retry
// tries once, like Open.
func OpenWait(ctx context.Context, o Options, retry func(ctx context.Context, err error) error) (outbox.Publisher, func(), error) {
	if o.URL == "" {
		return nil, nil, fmt.Errorf("no destination: set --destination or OUTBOX_DESTINATION (e.g. nats://127.0.0.1:4222)")
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, password and all
		}
		return nil, nil, fmt.Errorf("destination %s: %w", Redact(o.URL), err)
	}
	switch u.Scheme {
	case "nats", "tls":
		return openNATS(ctx, o, retry)
	case "kafka":
		return openKafka(ctx, o, retry)
	case "amqp", "amqps":
		return openAMQP(ctx, o, retry)
	case "http", "https":
		return openWebhook(ctx, o, retry)
	default:
		return nil, nil, fmt.Errorf("destination %s: unsupported scheme %q (supported: nats, kafka, amqp, http, https)", Redact(o.URL), u.Scheme)
	}
}

// openNATS opens a JetStream publisher (outboxnats) and waits, as OpenWait
// does, until the server answers and the stream is there. The URL's query
// parameters (stream, subject_prefix, source, duplicate_window, ...) win
// over the flags.
func openNATS(ctx context.Context, o Options, retry func(ctx context.Context, err error) error) (outbox.Publisher, func(), error) {
	server, fromURL, err := outboxnats.ParseURL(o.URL)
	if err != nil {
		return nil, nil, err
	}
	cfg := o.NATSConfig()
	if fromURL.Stream != "" {
		cfg.Stream = fromURL.Stream
	}
	if fromURL.SubjectPrefix != "" {
		cfg.SubjectPrefix = fromURL.SubjectPrefix
	}
	if fromURL.Source != "" {
		cfg.Source = fromURL.Source
	}
	if fromURL.DuplicateWindow != 0 {
		cfg.DuplicateWindow = fromURL.DuplicateWindow
	}
	cfg.AckTimeout, cfg.MaxPending = fromURL.AckTimeout, fromURL.MaxPending
	cfg.MonitorURL, cfg.CAFile = fromURL.MonitorURL, fromURL.CAFile
	// The connection is made (and remade) in the background: a server
	// that is not up yet is waited for, not an error.
	nc, err := connectNATS(server, fromURL, "outbox-relay")
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	var p *outboxnats.Publisher
	err = untilReachable(ctx, retry, func() (err error) {
		if !nc.IsConnected() {
			// NewPublisher would wait for its stream look-up to time out.
			err = fmt.Errorf("NATS at %s: connection is %s", outboxnats.Redact(server), strings.ToLower(nc.Status().String()))
			if last := nc.LastError(); last != nil {
				err = fmt.Errorf("%w: %w", err, last)
			}
			return outbox.Unavailable(err)
		}
		p, err = outboxnats.NewPublisher(ctx, js, cfg)
		return err
	})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return p, func() { _ = nc.Drain() }, nil
}

// untilReachable calls try until it succeeds. Each failure marked
// outbox.Unavailable goes to retry, with OpenWait's contract: retry pauses
// and returns nil to try again, or returns the error to give up with. Any
// other error, an Unavailable one when retry is nil or ctx has ended, and
// retry's error are returned.
func untilReachable(ctx context.Context, retry func(ctx context.Context, err error) error, try func() error) error {
	for {
		err := try()
		if err == nil {
			return nil
		}
		if retry != nil && outbox.IsUnavailable(err) && ctx.Err() == nil {
			err = retry(ctx, err)
		}
		if err != nil {
			return err
		}
	}
}

// probingPublisher is a publisher whose destination Probe checks.
type probingPublisher interface {
	outbox.Publisher
	outbox.Prober
	Close()
}

// probed waits, as OpenWait does, until p's Probe succeeds, and returns p
// and its Close; p is closed when it gives up.
func probed(ctx context.Context, p probingPublisher, retry func(ctx context.Context, err error) error) (outbox.Publisher, func(), error) {
	if err := untilReachable(ctx, retry, func() error { return p.Probe(ctx) }); err != nil {
		p.Close()
		return nil, nil, err
	}
	return p, p.Close, nil
}

// Redact returns a destination URL with any password or token replaced by
// "xxxxx" (a webhook URL as scheme://host/xxxxx: its path and query may
// hold the endpoint's token; a NATS server list with every server's user
// part hidden), for logs, errors and --help.
func Redact(raw string) string { return redact.URL(raw) }

// openKafka opens a Kafka publisher (outboxkafka) and waits, as OpenWait
// does, until the cluster answers a metadata request. The URL's source
// parameter, when set, wins over --source. A user in the URL without a
// password takes it from OUTBOX_KAFKA_PASSWORD (outboxkafka.ParseURL reads
// it); a failed SASL authentication or TLS handshake is unavailable, so
// OpenWait waits, logging why.
func openKafka(ctx context.Context, o Options, retry func(ctx context.Context, err error) error) (outbox.Publisher, func(), error) {
	cfg, err := outboxkafka.ParseURL(o.URL)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Source == "" {
		cfg.Source = o.Source
	}
	p, err := outboxkafka.NewPublisher(cfg)
	if err != nil {
		return nil, nil, err
	}
	return probed(ctx, p, retry)
}

func envDuration(key string, def time.Duration) time.Duration {
	if v := os.Getenv(key); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		fmt.Fprintf(os.Stderr, "ignoring %s=%q: not a duration\n", key, v)
	}
	return def
}
