package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

// Defaults for Config.
const (
	StreamDefault          = "OUTBOX"
	SubjectPrefixDefault   = "outbox"
	SourceDefault          = "/outbox"
	DuplicateWindowDefault = 2 * time.Minute
	AckTimeoutDefault      = 10 * time.Second
	MaxPendingDefault      = 1024
)

// Config configures a Publisher. The zero value uses the defaults.
type Config struct {
	// Stream is the JetStream stream name. Defaults to StreamDefault.
	Stream string
	// SubjectPrefix starts every subject: events are published on
	// <prefix>.<aggregate type token>.<aggregate id token> (see Subject). It
	// may itself have several tokens ("app.outbox"), without wildcards.
	// Defaults to SubjectPrefixDefault.
	SubjectPrefix string
	// Source is the CloudEvents "source" attribute. Defaults to SourceDefault.
	Source string
	// DuplicateWindow is the JetStream deduplication window set when the
	// stream is created (an existing stream keeps its own). Defaults to
	// DuplicateWindowDefault.
	DuplicateWindow time.Duration
	// AckTimeout bounds the wait for one message's acknowledgement; when it
	// passes the message fails as unavailable. Defaults to AckTimeoutDefault.
	AckTimeout time.Duration
	// MaxPending bounds how many messages the publisher has in flight
	// (published, not yet acknowledged) at once, over all concurrent Publish
	// calls. Larger batches are sent as acknowledgements free room. Defaults
	// to MaxPendingDefault.
	MaxPending int
	// CAFile, CertFile and KeyFile are PEM files for a TLS connection to
	// the server: the certificate authorities that sign its certificate
	// (instead of the system's roots), and a client certificate with its
	// key (both or neither). The Publisher publishes on the caller's
	// connection and does not read them: ParseURL sets them from the URL's
	// ca_file, cert_file and key_file, and ConnectOptions turns them into
	// options for nats.Connect.
	CAFile, CertFile, KeyFile string
	// MonitorURL is the server's HTTP monitoring endpoint (its http_port,
	// such as http://nats-1:8222), read only by CheckDurability: the
	// server's /varz says whether it fsyncs every write before
	// acknowledging it (sync_interval: always), which a client connection
	// cannot learn. Optional; ParseURL sets it from monitor_url.
	MonitorURL string
}

// ConnectOptions returns the nats.Connect options for c's TLS files: none
// when no file is named, otherwise TLS (nats.Secure) verified against
// CAFile's certificates, with CertFile and KeyFile as the client
// certificate. It reads the files; errors name the option and the file.
func (c Config) ConnectOptions() ([]nats.Option, error) {
	files := tlsfiles.Files{CA: c.CAFile, Cert: c.CertFile, Key: c.KeyFile}
	if !files.Set() {
		return nil, nil
	}
	tc, err := files.Config(nil)
	if err != nil {
		return nil, fmt.Errorf("outboxnats: %w", err)
	}
	return []nats.Option{nats.Secure(tc)}, nil
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = StreamDefault
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = SubjectPrefixDefault
	}
	if c.Source == "" {
		c.Source = SourceDefault
	}
	if c.DuplicateWindow <= 0 {
		c.DuplicateWindow = DuplicateWindowDefault
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = AckTimeoutDefault
	}
	if c.MaxPending <= 0 {
		c.MaxPending = MaxPendingDefault
	}
	return c
}

// Publisher publishes outbox messages to a NATS JetStream stream as
// CloudEvents in binary mode (see the package documentation). It implements
// outbox.Publisher and is safe for concurrent use.
type Publisher struct {
	cfg    Config
	nc     *nats.Conn
	admin  jetstream.JetStream // the caller's context: stream management and probes
	pub    jetstream.JetStream // our own context: async pending limit and ack timeout
	slots  chan struct{}       // one per message in flight
	closed chan struct{}       // closed when the connection is closed for good
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Prober    = (*Publisher)(nil)
)

// NewPublisher creates the stream (file storage, subjects "<prefix>.>", the
// deduplication window) or, if a stream of that name exists, checks that its
// subjects cover "<prefix>.>" and that it acknowledges publishes; otherwise it
// returns an error saying why. Stream management goes through js (so its
// domain or API prefix apply); publishing uses js's connection.
func NewPublisher(ctx context.Context, js jetstream.JetStream, cfg Config) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if js == nil || js.Conn() == nil {
		return nil, errors.New("outboxnats: no JetStream connection")
	}
	if err := validatePrefix(cfg.SubjectPrefix); err != nil {
		return nil, err
	}
	if err := validateStreamName(cfg.Stream); err != nil {
		return nil, err
	}
	nc := js.Conn()
	if nc.IsClosed() {
		return nil, outbox.Unavailable(fmt.Errorf("outboxnats: %w", nats.ErrConnectionClosed))
	}
	if nc.IsConnected() && !nc.HeadersSupported() {
		return nil, errors.New("outboxnats: the NATS server does not support message headers (needs NATS 2.2 or later)")
	}
	if err := ensureStream(ctx, js, cfg); err != nil {
		return nil, err
	}
	pub, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending+1),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("outboxnats: %w", err)
	}
	p := &Publisher{
		cfg:    cfg,
		nc:     nc,
		admin:  js,
		pub:    pub,
		slots:  make(chan struct{}, cfg.MaxPending),
		closed: make(chan struct{}),
	}
	status := nc.StatusChanged(nats.CLOSED)
	go func() {
		<-status
		close(p.closed)
		nc.RemoveStatusListener(status)
	}()
	if nc.IsClosed() { // closed before the listener was registered
		nc.RemoveStatusListener(status)
	}
	return p, nil
}

// ensureStream creates the stream or validates the existing one.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	want := cfg.SubjectPrefix + ".>"
	for attempt := 0; ; attempt++ {
		s, err := js.Stream(ctx, cfg.Stream)
		if err == nil {
			return checkStream(s.CachedInfo(), cfg)
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return classifyAdmin(fmt.Errorf("outboxnats: look up stream %s: %w", cfg.Stream, err))
		}
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        cfg.Stream,
			Description: "outbox events (" + want + ")",
			Subjects:    []string{want},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			Duplicates:  cfg.DuplicateWindow,
		})
		if err == nil {
			return nil
		}
		// Someone else created it meanwhile: validate theirs.
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && attempt == 0 {
			continue
		}
		return classifyAdmin(fmt.Errorf("outboxnats: create stream %s on %q: %w", cfg.Stream, want, err))
	}
}

func classifyAdmin(err error) error {
	if unavailable(err) {
		return outbox.Unavailable(err)
	}
	return err
}

// checkStream refuses a stream the publisher cannot use.
func checkStream(info *jetstream.StreamInfo, cfg Config) error {
	if info == nil {
		return fmt.Errorf("outboxnats: stream %s: no stream info", cfg.Stream)
	}
	want := cfg.SubjectPrefix + ".>"
	covered := false
	for _, s := range info.Config.Subjects {
		if subjectCovers(s, cfg.SubjectPrefix) {
			covered = true
			break
		}
	}
	if !covered {
		return fmt.Errorf("outboxnats: stream %s exists but its subjects %q do not cover %q: use another stream name or subject prefix, or add %q to the stream",
			cfg.Stream, info.Config.Subjects, want, want)
	}
	if info.Config.NoAck {
		return fmt.Errorf("outboxnats: stream %s does not acknowledge publishes (no_ack): the outbox needs acknowledgements", cfg.Stream)
	}
	if info.Config.Sealed {
		return fmt.Errorf("outboxnats: stream %s is sealed: it accepts no messages", cfg.Stream)
	}
	return nil
}

// subjectCovers reports whether the stream subject filter matches every
// subject under prefix (that is, everything "<prefix>.>" matches).
func subjectCovers(filter, prefix string) bool {
	f := strings.Split(filter, ".")
	p := strings.Split(prefix, ".")
	for i, tok := range f {
		if tok == ">" {
			return i <= len(p)
		}
		if i >= len(p) || (tok != "*" && tok != p[i]) {
			return false
		}
	}
	return false // the filter stops at the prefix or inside it: it lacks ">"
}

func validatePrefix(prefix string) error {
	if len(prefix) > MaxSubjectPrefixBytes {
		return fmt.Errorf("outboxnats: subject prefix is %d bytes, over the %d-byte limit", len(prefix), MaxSubjectPrefixBytes)
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("outboxnats: invalid subject prefix %q: it needs non-empty tokens separated by '.', without wildcards or whitespace", prefix)
		}
	}
	return nil
}

func validateStreamName(name string) error {
	if strings.ContainsAny(name, ".*> \t\r\n/\\") {
		return fmt.Errorf("outboxnats: invalid stream name %q: it cannot contain '.', '*', '>', '/', '\\' or whitespace", name)
	}
	return nil
}

// Stream returns the name of the stream the publisher writes to.
func (p *Publisher) Stream() string { return p.cfg.Stream }

// SubjectPrefix returns the prefix of the publisher's subjects.
func (p *Publisher) SubjectPrefix() string { return p.cfg.SubjectPrefix }

type inflight struct {
	i   int
	id  string
	paf jetstream.PubAckFuture
}

// Publish publishes msgs asynchronously and waits until each one was
// acknowledged by the stream, failed, or ctx ended. It returns nil when all
// were stored (a duplicate of an event id within the deduplication window
// counts as stored), otherwise one error per message, nil for those stored.
//
// Errors are classified for the relay: outbox.Unavailable when the server
// cannot be reached (connection closed or reconnecting, no stream answering
// the subject, no acknowledgement in time, JetStream unavailable, ctx
// deadline) and outbox.Permanent when the message can never be accepted
// (larger than the server's max payload or the stream's max message size,
// invalid header or subject). Publish does not retry.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	errs := make([]error, len(msgs))
	queue := make(chan inflight, len(msgs))
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		p.await(ctx, queue, errs)
	}()
	for i := range msgs {
		paf, err := p.send(ctx, &msgs[i])
		if err != nil {
			errs[i] = err
			continue
		}
		queue <- inflight{i, msgs[i].ID.String(), paf}
	}
	close(queue)
	<-waited
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// send publishes one message once a slot is free.
func (p *Publisher) send(ctx context.Context, msg *outbox.Message) (jetstream.PubAckFuture, error) {
	if err := ctx.Err(); err != nil {
		return nil, ctxError(ctx)
	}
	m, err := p.natsMsg(msg)
	if err != nil {
		return nil, err
	}
	if err := p.connected(); err != nil {
		return nil, err
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctxError(ctx)
	case <-p.closed:
		return nil, outbox.Unavailable(fmt.Errorf("publish event %s: %w", msg.ID, nats.ErrConnectionClosed))
	}
	paf, err := p.pub.PublishMsgAsync(m, jetstream.WithRetryAttempts(0))
	if err != nil {
		<-p.slots
		return nil, classify(fmt.Errorf("publish event %s: %w", msg.ID, err))
	}
	return paf, nil
}

// connected fails fast when the connection is not up: a message published
// while reconnecting would only sit in the client's buffer.
func (p *Publisher) connected() error {
	switch st := p.nc.Status(); st {
	case nats.CONNECTED, nats.DRAINING_SUBS:
		return nil
	case nats.CLOSED:
		return outbox.Unavailable(fmt.Errorf("publish: %w", nats.ErrConnectionClosed))
	default:
		return outbox.Unavailable(fmt.Errorf("publish: NATS connection is %s: %w", strings.ToLower(st.String()), nats.ErrDisconnected))
	}
}

// await collects the acknowledgements of the queued messages in order
// (JetStream acknowledges one connection's messages in order anyway).
func (p *Publisher) await(ctx context.Context, queue <-chan inflight, errs []error) {
	var abandoned []jetstream.PubAckFuture
	for f := range queue {
		var (
			err      error
			resolved bool
		)
		if abandoned == nil {
			select {
			case <-f.paf.Ok():
				resolved = true
			case err = <-f.paf.Err():
				resolved = true
			case <-ctx.Done():
			case <-p.closed:
			}
		} else {
			// ctx ended or the connection closed: take what is already
			// resolved, wait for nothing more.
			select {
			case <-f.paf.Ok():
				resolved = true
			case err = <-f.paf.Err():
				resolved = true
			default:
			}
		}
		switch {
		case !resolved:
			errs[f.i] = p.abandonError(ctx)
			abandoned = append(abandoned, f.paf)
		case err != nil:
			<-p.slots
			errs[f.i] = classify(fmt.Errorf("publish event %s: %w", f.id, err))
		default:
			<-p.slots
		}
	}
	if len(abandoned) > 0 {
		// Their slots come back once the client resolves them, at the
		// latest after AckTimeout.
		go func() {
			for _, paf := range abandoned {
				select {
				case <-paf.Ok():
				case <-paf.Err():
				}
				<-p.slots
			}
		}()
	}
}

func (p *Publisher) abandonError(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctxError(ctx)
	}
	return outbox.Unavailable(fmt.Errorf("waiting for ack: %w", nats.ErrConnectionClosed))
}

// ctxError is the error of a message whose publish or acknowledgement ctx
// cut short. A deadline is a timeout waiting for the broker (unavailable); a
// cancellation is returned as is.
func ctxError(ctx context.Context) error {
	err := fmt.Errorf("publish to NATS: %w", context.Cause(ctx))
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return outbox.Unavailable(err)
	}
	return err
}

// classify marks a publish error as unavailable, permanent or neither.
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
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrBadHeaderMsg) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case 10054, // message size exceeds maximum allowed
			10097: // header size exceeds maximum allowed
			return true
		}
	}
	return false
}

func unavailable(err error) bool {
	for _, target := range []error{
		nats.ErrConnectionClosed, nats.ErrDisconnected, nats.ErrConnectionReconnecting,
		nats.ErrConnectionDraining, nats.ErrNoServers, nats.ErrStaleConnection,
		nats.ErrReconnectBufExceeded, nats.ErrTimeout, nats.ErrNoResponders, nats.ErrInvalidConnection,
		jetstream.ErrNoStreamResponse, jetstream.ErrAsyncPublishTimeout, jetstream.ErrTooManyStalledMsgs,
		jetstream.ErrStreamNotFound, jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount,
		context.DeadlineExceeded,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case 10059, // stream not found
			10118, // stream is offline
			10008, // JetStream system temporarily unavailable
			10009, // JetStream cluster can not handle request
			10039, // JetStream not enabled for account
			10076, // JetStream not enabled
			10047, // insufficient storage resources available
			10109: // sealed stream: it accepts nothing, whatever the message
			return true
		}
		return api.Code == 503
	}
	return false
}
