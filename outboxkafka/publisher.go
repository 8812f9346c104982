package outboxkafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

// Defaults for Config.
const (
	TopicDefault           = "outbox." + AggregateTypePlaceholder
	SourceDefault          = "/outbox"
	DeliveryTimeoutDefault = 10 * time.Second
	DialTimeoutDefault     = 5 * time.Second
	// MaxRecordBytesDefault stays below the broker's default
	// message.max.bytes (1,048,588) with room for the batch header.
	MaxRecordBytesDefault = 1_000_000
)

// SASL mechanisms for Config.SASLMechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Config configures a Publisher. Only Brokers is required.
type Config struct {
	// Brokers are the seed brokers, "host:port".
	Brokers []string
	// Topic is the topic template: every "{aggregate_type}" in it is
	// replaced by the message's aggregate type, as it is (see Topic).
	// Defaults to TopicDefault, "outbox.{aggregate_type}". A template
	// without the placeholder sends every event to one topic. A message
	// whose aggregate type makes an invalid topic name fails as
	// outbox.Permanent.
	Topic string
	// Source is the CloudEvents "source" attribute. Defaults to
	// SourceDefault.
	Source string
	// DeliveryTimeout bounds how long a record may wait to be acknowledged
	// (kgo.RecordDeliveryTimeout); when it passes the message fails as
	// unavailable. Defaults to DeliveryTimeoutDefault.
	DeliveryTimeout time.Duration
	// DialTimeout bounds a connection attempt to a broker. Defaults to
	// DialTimeoutDefault.
	DialTimeout time.Duration
	// MaxRecordBytes is the largest record (key, value and headers) sent;
	// a larger one fails as outbox.Permanent before it is sent, alone. Keep
	// it at or below the topics' max.message.bytes: a record the broker
	// refuses as too large fails the whole batch it is in. Defaults to
	// MaxRecordBytesDefault.
	MaxRecordBytes int

	// SASLMechanism authenticates the connections with SASL: SASLPlain,
	// SASLScramSHA256 or SASLScramSHA512, as User with Password (both
	// required then). Empty, the default, is no SASL. PLAIN sends the
	// password as it is: use it with TLS.
	SASLMechanism string
	// User is the SASL user name.
	User string
	// Password is the SASL password. String, GoString and errors never show
	// it.
	Password string

	// TLS dials the brokers with TLS, verifying their certificates against
	// the system's roots, or CAFile's, and the broker's host name. Setting
	// CAFile, CertFile, KeyFile or TLSConfig implies it.
	TLS bool
	// CAFile is a PEM file of the certificate authorities that sign the
	// brokers' certificates, in place of the system's roots.
	CAFile string
	// CertFile and KeyFile are PEM files of the client's certificate and
	// its key, for brokers that authenticate clients by certificate; both
	// or neither.
	CertFile, KeyFile string
	// TLSConfig is the TLS configuration to start from (it is cloned, and
	// CAFile, CertFile and KeyFile are added to the clone). Nil starts from
	// an empty one.
	TLSConfig *tls.Config
}

// String returns the configuration with the password redacted, for logs.
func (c Config) String() string {
	pw := ""
	if c.Password != "" {
		pw = "xxxxx"
	}
	return fmt.Sprintf("{Brokers:%v Topic:%s Source:%s DeliveryTimeout:%s DialTimeout:%s MaxRecordBytes:%d SASLMechanism:%s User:%s Password:%s TLS:%t CAFile:%s CertFile:%s KeyFile:%s TLSConfig:%t}",
		c.Brokers, c.Topic, c.Source, c.DeliveryTimeout, c.DialTimeout, c.MaxRecordBytes, c.SASLMechanism, c.User, pw,
		c.TLS, c.CAFile, c.CertFile, c.KeyFile, c.TLSConfig != nil)
}

// GoString is String: %#v does not print the password either.
func (c Config) GoString() string { return "outboxkafka.Config" + c.String() }

// tlsFiles are the CA and client certificate files.
func (c Config) tlsFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: c.CAFile, Cert: c.CertFile, Key: c.KeyFile}
}

// usesTLS reports whether the brokers are dialed with TLS.
func (c Config) usesTLS() bool {
	return c.TLS || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.TLSConfig != nil
}

// check validates the SASL and TLS fields without reading any file.
func (c Config) check() error {
	switch c.SASLMechanism {
	case "":
		if c.User != "" || c.Password != "" {
			return errors.New("outboxkafka: a SASL user or password without SASLMechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.User == "" {
			return fmt.Errorf("outboxkafka: SASL %s without a user", c.SASLMechanism)
		}
		if c.Password == "" {
			return fmt.Errorf("outboxkafka: SASL %s: no password for user %q", c.SASLMechanism, c.User)
		}
	default:
		return fmt.Errorf("outboxkafka: unknown SASL mechanism %q (known: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)", c.SASLMechanism)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("outboxkafka: a client certificate needs both CertFile and KeyFile")
	}
	return nil
}

// saslOpt returns the client option for the SASL fields, or nil.
func (c Config) saslOpt() kgo.Opt {
	var m sasl.Mechanism
	switch c.SASLMechanism {
	case SASLPlain:
		m = plain.Auth{User: c.User, Pass: c.Password}.AsMechanism()
	case SASLScramSHA256:
		m = scram.Auth{User: c.User, Pass: c.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		m = scram.Auth{User: c.User, Pass: c.Password}.AsSha512Mechanism()
	default:
		return nil
	}
	return kgo.SASL(m)
}

// tlsConfig returns the TLS configuration of the TLS fields, reading the
// files, or nil without TLS.
func (c Config) tlsConfig() (*tls.Config, error) {
	if !c.usesTLS() {
		return nil, nil
	}
	tc, err := c.tlsFiles().Config(c.TLSConfig)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: %w", err)
	}
	return tc, nil
}

func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = TopicDefault
	}
	if c.Source == "" {
		c.Source = SourceDefault
	}
	if c.DeliveryTimeout <= 0 {
		c.DeliveryTimeout = DeliveryTimeoutDefault
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DialTimeoutDefault
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = MaxRecordBytesDefault
	}
	return c
}

// Publisher publishes outbox messages to Kafka topics as CloudEvents in
// binary mode (see the package documentation). It implements
// outbox.Publisher and outbox.Prober and is safe for concurrent use.
type Publisher struct {
	cfg    Config
	client *kgo.Client
}

var (
	_ outbox.Publisher        = (*Publisher)(nil)
	_ outbox.Prober           = (*Publisher)(nil)
	_ outbox.OrderedPipeliner = (*Publisher)(nil)
)

// OrderedPipelining reports true: the relay may pass an aggregate's
// consecutive events in one Publish call (see outbox.OrderedPipeliner).
// They are produced in that order to one partition by an idempotent
// producer: the broker refuses a record whose sequence number does not
// follow the last one it stored, and when a record fails the client fails
// every record buffered behind it in the partition, so a failed event is
// never followed by a stored successor. An event that fails before it is
// produced (over MaxRecordBytes, an invalid topic) takes the later events of
// its aggregate in the call with it, unsent.
func (p *Publisher) OrderedPipelining() bool { return true }

// NewPublisher creates a Kafka client for cfg.Brokers with acks=all,
// idempotent writes and the key partitioner (the record key is the
// aggregate id, so an aggregate's events stay on one partition), with SASL
// and TLS as cfg says (reading its CA and certificate files now). opts are
// passed to kgo.NewClient before the publisher's own, for logging or other
// SASL mechanisms; options that would weaken those guarantees are
// overridden, and kgo.DisableIdempotentWrite is refused. It does not
// connect: Probe does. Close the publisher to close the client.
func NewPublisher(cfg Config, opts ...kgo.Opt) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("outboxkafka: no brokers")
	}
	if _, err := Topic(cfg.Topic, "t"); err != nil {
		return nil, fmt.Errorf("outboxkafka: topic template %q: %w", cfg.Topic, err)
	}
	if cfg.MaxRecordBytes > 1<<30 {
		return nil, fmt.Errorf("outboxkafka: MaxRecordBytes %d is over 1 GiB", cfg.MaxRecordBytes)
	}
	conn, err := cfg.ConnectOptions()
	if err != nil {
		return nil, err
	}
	// No linger by default: the relay hands over a whole batch and waits
	// for its acknowledgements, so waiting for more records only adds
	// latency (10 ms a call with franz-go's default). opts may set one.
	all := append([]kgo.Opt{kgo.ProducerLinger(0)}, opts...)
	all = append(all, conn...)
	all = append(all,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxRecordBytes+512)),
	)
	client, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: %w", err)
	}
	if client.OptValue(kgo.DisableIdempotentWrite) == true {
		client.Close()
		return nil, errors.New("outboxkafka: idempotent writes cannot be disabled")
	}
	return &Publisher{cfg: cfg, client: client}, nil
}

// ConnectOptions returns the kgo options that reach the cluster as c says:
// the seed brokers, the dial timeout (DialTimeoutDefault when zero), SASL
// and TLS, reading the CA and certificate files. A consumer of the same
// cluster passes them to kgo.NewClient, so that the URL the relay takes
// configures it too.
func (c Config) ConnectOptions() ([]kgo.Opt, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	tc, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	dial := c.DialTimeout
	if dial <= 0 {
		dial = DialTimeoutDefault
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.DialTimeout(dial)}
	if o := c.saslOpt(); o != nil {
		opts = append(opts, o)
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	return opts, nil
}

// Client returns the publisher's Kafka client.
func (p *Publisher) Client() *kgo.Client { return p.client }

// Close closes the client; messages still in flight fail as unavailable.
func (p *Publisher) Close() { p.client.Close() }

type aggregate struct{ typ, id string }

type result struct {
	i   int
	err error
}

// Publish produces msgs concurrently and waits until each one was
// acknowledged by all in-sync replicas, failed, or ctx ended. It returns nil
// when all were stored, otherwise one error per message, nil for those
// stored.
//
// Errors are classified for the relay: outbox.Unavailable when the cluster
// cannot be reached or cannot store anything now (no broker answering, no
// acknowledgement within DeliveryTimeout or ctx's deadline, a partition
// without a leader, not enough in-sync replicas, the client closed) and
// outbox.Permanent when the message can never be accepted (over
// MaxRecordBytes, refused by the broker as too large, an invalid topic name,
// no authorization for the topic). A failed SASL authentication or TLS
// handshake (a wrong password, a broker certificate not signed by a trusted
// authority) is unavailable: no message can be published until the
// configuration or the cluster is fixed. Anything else is a plain, retryable
// error. Publish does not retry beyond what the client itself does within
// DeliveryTimeout.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	// The client enforces DeliveryTimeout only between requests; while no
	// broker answers at all, this bound ends the wait.
	ctx, cancel := context.WithTimeoutCause(ctx, p.cfg.DeliveryTimeout,
		fmt.Errorf("no acknowledgement within %s: %w", p.cfg.DeliveryTimeout, kgo.ErrRecordTimeout))
	defer cancel()
	errs := make([]error, len(msgs))
	done := make(chan result, len(msgs)) // buffered: a late promise never blocks
	sent := make([]bool, len(msgs))
	pending := 0
	var stopped map[aggregate]uuid.UUID // aggregates whose event failed before it was produced
	for i := range msgs {
		agg := aggregate{msgs[i].AggregateType, msgs[i].AggregateID}
		if before, ok := stopped[agg]; ok {
			errs[i] = fmt.Errorf("outboxkafka: event %s not produced: event %s of its aggregate, before it in the call, failed", msgs[i].ID, before)
			continue
		}
		r, err := p.record(&msgs[i])
		if err != nil {
			errs[i] = err
			if stopped == nil {
				stopped = map[aggregate]uuid.UUID{}
			}
			stopped[agg] = msgs[i].ID
			continue
		}
		if ctx.Err() != nil {
			errs[i] = ctxError(ctx)
			continue
		}
		sent[i] = true
		pending++
		id := msgs[i].ID
		p.client.Produce(ctx, r, func(r *kgo.Record, err error) {
			if err != nil {
				err = classify(fmt.Errorf("outboxkafka: publish event %s to %s: %w", id, r.Topic, err))
			}
			done <- result{i, err}
		})
	}
wait:
	for pending > 0 {
		select {
		case r := <-done:
			errs[r.i] = r.err
			sent[r.i] = false
			pending--
		case <-ctx.Done():
			break wait
		}
	}
	if pending > 0 {
		// ctx ended: take what is already resolved, wait for nothing more.
		for drained := false; !drained; {
			select {
			case r := <-done:
				errs[r.i] = r.err
				sent[r.i] = false
			default:
				drained = true
			}
		}
		for i, waiting := range sent {
			if waiting {
				errs[i] = ctxError(ctx)
			}
		}
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// record builds the record of msg, within MaxRecordBytes.
func (p *Publisher) record(msg *outbox.Message) (*kgo.Record, error) {
	r, err := encode(msg, p.cfg.Topic, p.cfg.Source)
	if err != nil {
		return nil, err
	}
	if size := recordSize(r); size > p.cfg.MaxRecordBytes {
		return nil, outbox.Permanent(fmt.Errorf("outboxkafka: event %s: record of about %d bytes (key, value and headers) exceeds MaxRecordBytes %d: %w",
			msg.ID, size, p.cfg.MaxRecordBytes, kerr.MessageTooLarge))
	}
	return r, nil
}

// ctxError is the error of a message whose publish ctx cut short. A
// deadline is a timeout waiting for the broker (unavailable); a
// cancellation is returned as is.
func ctxError(ctx context.Context) error {
	err := fmt.Errorf("outboxkafka: publish: %w", context.Cause(ctx))
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return outbox.Unavailable(err)
	}
	return err
}

// classify marks a produce error as unavailable, permanent or neither.
func classify(err error) error {
	switch {
	case permanent(err):
		return outbox.Permanent(err)
	case unavailable(err):
		return outbox.Unavailable(err)
	}
	return err
}

func permanent(err error) bool {
	for _, target := range []error{
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed, kerr.InvalidRecord, kerr.CorruptMessage,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

func unavailable(err error) bool {
	for _, target := range []error{
		kgo.ErrRecordTimeout, kgo.ErrClientClosed, context.DeadlineExceeded,
		kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.LeaderNotAvailable,
		kerr.NotLeaderForPartition, kerr.BrokerNotAvailable, kerr.RequestTimedOut,
		kerr.NetworkException, kerr.KafkaStorageError,
		kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	var (
		ne  net.Error
		ve  *tls.CertificateVerificationError
		ae  tls.AlertError
		rhe tls.RecordHeaderError
		uae x509.UnknownAuthorityError
		he  x509.HostnameError
		ce  x509.CertificateInvalidError
	)
	return errors.As(err, &ne) || errors.As(err, &ve) || errors.As(err, &ae) || errors.As(err, &rhe) ||
		errors.As(err, &uae) || errors.As(err, &he) || errors.As(err, &ce)
}
