package outboxkafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
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
	// mu makes Publish calls take turns: a call buffers all its records
	// before the client sends any (kgo.ManualFlushing), so that a record
	// the broker refuses fails every later record of its partition in the
	// call with it; another call flushing meanwhile would send some of them
	// early.
	mu sync.Mutex
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
// every record buffered behind it in the partition; every record of a call
// is buffered before any is sent, so a failed event is never followed by a
// stored successor. An event that fails before it is produced (over
// MaxRecordBytes, an invalid topic) takes the later events of its aggregate
// in the call with it, unsent; so does one the broker refuses when it is
// produced again alone (see Publish).
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
		// A call's records are all buffered, then flushed (see Publisher.mu);
		// a relay's batch is far below this many records.
		kgo.ManualFlushing(),
		kgo.MaxBufferedRecords(1<<20),
		// A topic the cluster does not have fails its records after one
		// metadata retry (franz-go's default is four, with backoff), so that
		// the refusal reaches the relay as its route's (RouteUnavailable)
		// well within DeliveryTimeout: on a loaded machine the four retries
		// outlasted a 2 s delivery timeout, and the records failed as timed
		// out, an outage of the whole destination.
		kgo.UnknownTopicRetries(1),
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

// Client returns the publisher's Kafka client. It flushes manually
// (kgo.ManualFlushing): a caller producing through it calls Flush.
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
// The broker refuses a whole record batch when one of its records is too
// large for the topic (max.message.bytes, which may be below
// MaxRecordBytes), or the batch as a whole is, and the client then fails
// every record buffered for that partition with the same error. Such a
// refusal says nothing about which record it concerns, so Publish produces
// each record it failed again alone, one at a time per partition and in
// call order (so an aggregate's records keep their order, and stop at the
// first that fails): a record the broker refuses alone fails as permanent,
// and the others are stored. The refusal of one record never fails its
// neighbours.
//
// Errors are classified for the relay, by whether the refusal depends on
// the message: outbox.Permanent when the message can never be accepted
// (over MaxRecordBytes, refused by the broker as too large or invalid when
// produced alone, an invalid topic name), outbox.RouteUnavailable, the
// route being the topic, when the broker refuses the topic as a whole (it
// does not exist, or the relay is not authorized to write to it), and
// outbox.Unavailable when the cluster cannot be reached or cannot store
// anything now (no broker answering, no acknowledgement within
// DeliveryTimeout or ctx's deadline, a partition without a leader, not
// enough in-sync replicas, the client closed, no authorization on the
// cluster). A failed SASL authentication or TLS handshake (a wrong
// password, a broker certificate not signed by a trusted authority) is
// unavailable: no message can be published until the configuration or the
// cluster is fixed. Anything else is a plain, retryable error. Publish does
// not retry beyond what the client itself does within DeliveryTimeout, and
// the one production alone of a refused record.
//
// Calls take turns: a call's records are all buffered before the client
// sends any, so that a refused record fails the later records of its
// partition in the call, never lets one of them be stored after it.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	parent := ctx
	p.mu.Lock()
	defer p.mu.Unlock()
	// The client enforces DeliveryTimeout only between requests; while no
	// broker answers at all, this bound ends the wait.
	ctx, cancel := p.deliveryCtx(parent)
	defer cancel()
	errs := make([]error, len(msgs))
	recs := make([]*kgo.Record, len(msgs))
	var todo []int
	var stopped map[aggregate]uuid.UUID // aggregates whose event failed before it was produced
	for i := range msgs {
		agg := aggregate{msgs[i].AggregateType, msgs[i].AggregateID}
		if before, ok := stopped[agg]; ok {
			errs[i] = notProduced(msgs[i].ID, before)
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
		recs[i] = r
		todo = append(todo, i)
	}
	p.produce(ctx, msgs, recs, todo, errs)
	if refused := refusedInBatch(errs, todo); len(refused) > 0 {
		actx, cancel := p.deliveryCtx(parent)
		defer cancel()
		p.produceAlone(actx, msgs, recs, refused, errs)
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// deliveryCtx bounds a wait for acknowledgements by DeliveryTimeout.
func (p *Publisher) deliveryCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, p.cfg.DeliveryTimeout,
		fmt.Errorf("no acknowledgement within %s: %w", p.cfg.DeliveryTimeout, kgo.ErrRecordTimeout))
}

// notProduced is the error of an event left unsent because an earlier event
// of its aggregate in the call failed.
func notProduced(id, before uuid.UUID) error {
	return fmt.Errorf("outboxkafka: event %s not produced: event %s of its aggregate, before it in the call, failed", id, before)
}

// produce buffers the records recs[i] for i in todo, flushes them, and waits
// until each one was acknowledged, failed, or ctx ended, setting errs[i].
func (p *Publisher) produce(ctx context.Context, msgs []outbox.Message, recs []*kgo.Record, todo []int, errs []error) {
	if len(todo) == 0 {
		return
	}
	done := make(chan result, len(todo)) // buffered: a late promise never blocks
	sent := make(map[int]bool, len(todo))
	for _, i := range todo {
		if ctx.Err() != nil {
			errs[i] = ctxError(ctx)
			continue
		}
		sent[i] = true
		id := msgs[i].ID
		p.client.Produce(ctx, recs[i], func(r *kgo.Record, err error) {
			if err != nil {
				err = classify(r.Topic, fmt.Errorf("outboxkafka: publish event %s to %s: %w", id, r.Topic, err))
			}
			done <- result{i, err}
		})
	}
	if len(sent) == 0 {
		return
	}
	flushed := make(chan struct{})
	go func() { defer close(flushed); _ = p.client.Flush(ctx) }()
	defer func() { <-flushed }() // returns once ctx ends at the latest
wait:
	for len(sent) > 0 {
		select {
		case r := <-done:
			errs[r.i] = r.err
			delete(sent, r.i)
		case <-ctx.Done():
			break wait
		}
	}
	if len(sent) > 0 {
		// ctx ended: take what is already resolved, wait for nothing more.
		for drained := false; !drained; {
			select {
			case r := <-done:
				errs[r.i] = r.err
				delete(sent, r.i)
			default:
				drained = true
			}
		}
		for i := range sent {
			errs[i] = ctxError(ctx)
		}
	}
}

// refusedInBatch returns, among the records produced (todo), those the
// broker refused for a reason that concerns a record, not the cluster: too
// large, invalid, corrupt. The client fails a refused batch's records, and
// every record buffered behind them in the partition, with the same error,
// so it may be another record's.
func refusedInBatch(errs []error, todo []int) []int {
	var out []int
	for _, i := range todo {
		if errs[i] != nil && recordRefusal(errs[i]) {
			out = append(out, i)
		}
	}
	return out
}

// produceAlone produces again, each alone, the records refused (indices in
// call order): one at a time per partition, partitions side by side. An
// aggregate's records all go to one partition, so they go in order; the
// first that fails stops its aggregate (the later ones are not produced).
// A record the broker refuses alone is the refused one: permanent.
func (p *Publisher) produceAlone(ctx context.Context, msgs []outbox.Message, recs []*kgo.Record, refused []int, errs []error) {
	type partition struct {
		topic string
		n     int32
	}
	byPartition := map[partition][]int{}
	var order []partition
	for _, i := range refused {
		k := partition{recs[i].Topic, recs[i].Partition}
		if _, ok := byPartition[k]; !ok {
			order = append(order, k)
		}
		byPartition[k] = append(byPartition[k], i)
	}
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		go func(idx []int) {
			defer wg.Done()
			stopped := map[aggregate]uuid.UUID{}
			for _, i := range idx {
				agg := aggregate{msgs[i].AggregateType, msgs[i].AggregateID}
				if before, ok := stopped[agg]; ok {
					errs[i] = notProduced(msgs[i].ID, before)
					continue
				}
				first := errs[i]
				if ctx.Err() != nil {
					// No time left to tell: not the event's failure.
					errs[i] = outbox.Unavailable(fmt.Errorf("outboxkafka: event %s: its record batch was refused (%v) and there was no time left to produce it alone", msgs[i].ID, first))
					stopped[agg] = msgs[i].ID
					continue
				}
				r, err := p.record(&msgs[i]) // a fresh record: the failed one carries the partition's old state
				if err == nil {
					err = p.produceOne(ctx, msgs[i].ID, r)
				}
				errs[i] = err
				if err != nil {
					if recordRefusal(err) {
						errs[i] = outbox.Permanent(fmt.Errorf("refused when produced alone: %w", err))
					}
					stopped[agg] = msgs[i].ID
				}
			}
		}(byPartition[k])
	}
	wg.Wait()
}

// produceOne produces r alone and waits for its acknowledgement.
func (p *Publisher) produceOne(ctx context.Context, id uuid.UUID, r *kgo.Record) error {
	done := make(chan error, 1)
	p.client.Produce(ctx, r, func(r *kgo.Record, err error) {
		if err != nil {
			err = classify(r.Topic, fmt.Errorf("outboxkafka: publish event %s to %s: %w", id, r.Topic, err))
		}
		done <- err
	})
	flushed := make(chan struct{})
	go func() { defer close(flushed); _ = p.client.Flush(ctx) }()
	defer func() { <-flushed }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done:
			return err
		default:
			return ctxError(ctx)
		}
	}
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

// classify marks a produce error to topic as permanent, the topic's route
// unavailable, unavailable, or neither.
func classify(topic string, err error) error {
	switch {
	case permanent(err):
		return outbox.Permanent(err)
	case routeUnavailable(err):
		return outbox.RouteUnavailable(topic, err)
	case unavailable(err):
		return outbox.Unavailable(err)
	}
	return err
}

// recordRefusal reports whether the broker refused err's record batch for
// a reason that concerns a record (or the batch's size), not the cluster
// or the topic: the client fails every record buffered behind it with the
// same error, so it may be another record's.
func recordRefusal(err error) bool {
	for _, target := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

func permanent(err error) bool {
	return recordRefusal(err) || errors.Is(err, kerr.InvalidTopicException)
}

// routeUnavailable: the topic as a whole is refused, whatever the message:
// it does not exist (the publisher does not create topics), or the relay
// may not write to it. Create the topic or grant the ACL and every event
// held for it goes out.
func routeUnavailable(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) ||
		errors.Is(err, kerr.TopicAuthorizationFailed)
}

func unavailable(err error) bool {
	for _, target := range []error{
		kgo.ErrRecordTimeout, kgo.ErrClientClosed, context.DeadlineExceeded,
		kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.LeaderNotAvailable,
		kerr.NotLeaderForPartition, kerr.BrokerNotAvailable, kerr.RequestTimedOut,
		kerr.NetworkException, kerr.KafkaStorageError,
		kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState,
		kerr.ClusterAuthorizationFailed,
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
