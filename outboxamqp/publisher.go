package outboxamqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	iredact "github.com/pgoutbox/outbox/internal/redact"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

// Defaults for Config.
const (
	URLDefault            = "amqp://guest:guest@127.0.0.1:5672/"
	ExchangeDefault       = "outbox"
	RoutingKeyDefault     = "outbox." + AggregateTypePlaceholder
	SourceDefault         = "/outbox"
	ConfirmTimeoutDefault = 10 * time.Second
	DialTimeoutDefault    = 5 * time.Second
	// MaxMessageBytesDefault is 16 MiB: well below RabbitMQ's default
	// max_message_size (128 MiB), and about as large as a message should
	// be that a broker keeps in memory and a consumer reads at once.
	MaxMessageBytesDefault = 16 << 20
	// returnsBuffer holds returned messages until Publish reads them.
	returnsBuffer = 256
)

// Config configures a Publisher. Every field is optional.
type Config struct {
	// URL is the broker's address, amqp://user:password@host:port/vhost or
	// amqps://... (see amqp091.ParseURI). Defaults to URLDefault. It may
	// hold a password: the Publisher never prints it, and Config's String
	// method redacts it.
	URL string
	// Exchange is the exchange every message is published to. Defaults to
	// ExchangeDefault, "outbox".
	Exchange string
	// NoDeclare leaves the exchange alone: it must exist. By default the
	// publisher declares Exchange as a durable topic exchange on every
	// connection (which succeeds when it exists with those properties).
	NoDeclare bool
	// RoutingKey is the routing key template: "{aggregate_type}" and
	// "{aggregate_id}" in it are replaced by the message's (see
	// RoutingKey). Defaults to RoutingKeyDefault, "outbox.{aggregate_type}".
	RoutingKey string
	// Source is the CloudEvents "source" attribute. Defaults to
	// SourceDefault.
	Source string
	// ConfirmTimeout bounds how long Publish waits for the broker to
	// confirm a batch; messages not confirmed by then fail as unavailable.
	// Defaults to ConfirmTimeoutDefault.
	ConfirmTimeout time.Duration
	// DialTimeout bounds connecting (TCP, TLS and the AMQP handshake).
	// Defaults to DialTimeoutDefault.
	DialTimeout time.Duration
	// MaxMessageBytes is the largest message sent (body, properties and
	// routing key); a larger one fails as outbox.Permanent before it is
	// sent, alone. Keep it at or below the broker's max_message_size.
	// Defaults to MaxMessageBytesDefault.
	MaxMessageBytes int
	// CAFile is a PEM file of the certificate authorities that sign the
	// broker's certificate, instead of the system's roots. CertFile and
	// KeyFile are PEM files of a client certificate and its key (both or
	// neither), for a broker that requires one. They need an amqps:// URL,
	// and are read by NewPublisher.
	CAFile, CertFile, KeyFile string
	// CheckQueues names the queues bound to Exchange for the relay's
	// messages, which CheckDurability inspects (durable? quorum?): AMQP
	// 0-9-1 cannot list an exchange's bindings, so the publisher cannot
	// find them itself. Optional; ParseURL sets it from check_queues.
	CheckQueues []string
	// TLSConfig is the TLS configuration to start from for amqps:// (it is
	// cloned, and CAFile, CertFile and KeyFile are added to the clone). Nil
	// starts from the system's roots; the server name is the URL's host
	// unless it sets one.
	TLSConfig *tls.Config
}

// String describes the configuration with the URL's password redacted.
func (c Config) String() string {
	return fmt.Sprintf("{URL:%s Exchange:%s NoDeclare:%t RoutingKey:%s Source:%s ConfirmTimeout:%s DialTimeout:%s MaxMessageBytes:%d CAFile:%s CertFile:%s KeyFile:%s TLSConfig:%t}",
		redact(c.URL), c.Exchange, c.NoDeclare, c.RoutingKey, c.Source, c.ConfirmTimeout, c.DialTimeout, c.MaxMessageBytes,
		c.CAFile, c.CertFile, c.KeyFile, c.TLSConfig != nil)
}

// GoString is String: %#v does not print the password either.
func (c Config) GoString() string { return "outboxamqp.Config" + c.String() }

// redact returns raw as every binary shows a URL (internal/redact.URL): its
// password masked, or a placeholder when it does not parse.
func redact(raw string) string { return iredact.URL(raw) }

func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = URLDefault
	}
	if c.Exchange == "" {
		c.Exchange = ExchangeDefault
	}
	if c.RoutingKey == "" {
		c.RoutingKey = RoutingKeyDefault
	}
	if c.Source == "" {
		c.Source = SourceDefault
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = ConfirmTimeoutDefault
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DialTimeoutDefault
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = MaxMessageBytesDefault
	}
	return c
}

// Publisher publishes outbox messages to a RabbitMQ exchange as CloudEvents
// in binary mode (see the package documentation). It implements
// outbox.Publisher and outbox.Prober, is safe for concurrent use, and
// connects lazily: on the first Publish or Probe, and again on the next one
// after the connection was lost.
type Publisher struct {
	cfg   Config
	shown string      // cfg.URL redacted
	tls   *tls.Config // for amqps://, cloned at each dial; nil for amqp://

	mu      sync.Mutex
	conn    *amqp.Connection
	blocked *atomic.Bool // the broker blocked conn (resource alarm)
	idle    []*session   // channels in confirm mode on conn, not in use
	closed  bool
}

// session is one channel in confirm mode, used by one Publish at a time.
type session struct {
	conn    *amqp.Connection
	blocked *atomic.Bool
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
	reason  *amqp.Error // why the channel closed, once known
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Prober    = (*Publisher)(nil)
)

// NewPublisher validates cfg and returns a publisher. It does not connect:
// Probe does, and so does the first Publish. Close it when done.
func NewPublisher(cfg Config) (*Publisher, error) {
	cfg = cfg.withDefaults()
	shown := redact(cfg.URL)
	u, err := url.Parse(cfg.URL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, password included
		}
		return nil, fmt.Errorf("outboxamqp: broker URL: %w", err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return nil, fmt.Errorf("outboxamqp: broker URL %s: scheme %q, want amqp or amqps", shown, u.Scheme)
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("outboxamqp: broker URL %s: bad port %q", shown, port)
		}
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("outboxamqp: broker URL %s: %s", shown, redactIn(err.Error(), u))
	}
	if len(cfg.Exchange) > maxShortString {
		return nil, fmt.Errorf("outboxamqp: exchange name of %d bytes exceeds AMQP's %d", len(cfg.Exchange), maxShortString)
	}
	if _, err := RoutingKey(cfg.RoutingKey, "t", "i"); err != nil {
		return nil, fmt.Errorf("outboxamqp: routing key template %q: %w", cfg.RoutingKey, err)
	}
	if cfg.MaxMessageBytes > 512<<20 {
		return nil, fmt.Errorf("outboxamqp: MaxMessageBytes %d is over RabbitMQ's limit of 512 MiB", cfg.MaxMessageBytes)
	}
	p := &Publisher{cfg: cfg, shown: shown}
	if p.tls, err = cfg.TLSClientConfig(); err != nil {
		return nil, err
	}
	return p, nil
}

// TLSClientConfig returns the TLS configuration an amqps:// connection
// uses (TLSConfig with the CA and client certificate files added, reading
// them), or nil for amqp://, where the files and TLSConfig are refused. A
// consumer of the same broker passes it to amqp.DialConfig, so that the
// URL the relay takes configures it too.
func (c Config) TLSClientConfig() (*tls.Config, error) {
	files := c.tlsFiles()
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, errors.New("outboxamqp: broker URL: not valid")
	}
	if u.Scheme != "amqps" {
		if files.Set() || c.TLSConfig != nil {
			return nil, fmt.Errorf("outboxamqp: broker URL %s: a CA or client certificate needs amqps:// (TLS)", redact(c.URL))
		}
		return nil, nil
	}
	tc, err := files.Config(c.TLSConfig)
	if err != nil {
		return nil, fmt.Errorf("outboxamqp: %w", err)
	}
	return tc, nil
}

// tlsFiles are the CA and client certificate files.
func (c Config) tlsFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: c.CAFile, Cert: c.CertFile, Key: c.KeyFile}
}

// redactIn replaces u's password in s, should s repeat it.
func redactIn(s string, u *url.URL) string {
	if pw, ok := u.User.Password(); ok && pw != "" {
		for _, p := range []string{pw, url.PathEscape(pw), url.QueryEscape(pw)} {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

// Close closes the connection; a Publish in flight fails its unconfirmed
// messages as unavailable. Publish and Probe after Close fail as
// unavailable.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.dropLocked()
}

// dropLocked closes the connection (and with it every channel).
func (p *Publisher) dropLocked() {
	if p.conn != nil {
		_ = p.conn.CloseDeadline(time.Now().Add(time.Second))
	}
	p.conn, p.blocked, p.idle = nil, nil, nil
}

// unavailable wraps err as outbox.Unavailable, naming the broker.
func (p *Publisher) unavailable(err error) error {
	return outbox.Unavailable(fmt.Errorf("outboxamqp: broker %s: %w", p.shown, err))
}

// connectLocked makes sure p.conn is open, dialling and declaring the
// exchange when it is not.
func (p *Publisher) connectLocked(ctx context.Context) error {
	if p.closed {
		return p.unavailable(errors.New("publisher closed"))
	}
	if p.conn != nil && !p.conn.IsClosed() {
		return nil
	}
	p.dropLocked()
	timeout := p.cfg.DialTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	if timeout <= 0 {
		return p.unavailable(fmt.Errorf("connect: %w", context.Cause(ctx)))
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outbox relay")
	var tc *tls.Config
	if p.tls != nil {
		tc = p.tls.Clone() // amqp091 sets its ServerName
	}
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{
		TLSClientConfig: tc,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds TLS and the AMQP handshake; amqp091 clears it after.
			return c, c.SetDeadline(time.Now().Add(timeout))
		},
		Properties: props,
	})
	if err != nil {
		return p.unavailable(fmt.Errorf("connect: %w", err))
	}
	blocked := new(atomic.Bool)
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() { // ends when the connection closes
		for b := range blocks {
			blocked.Store(b.Active)
		}
	}()
	if !p.cfg.NoDeclare {
		err := rpc(ctx, conn, func() error {
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			if err := ch.ExchangeDeclare(p.cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
				return fmt.Errorf("declare exchange %q: %w", p.cfg.Exchange, err)
			}
			return ch.Close()
		})
		if err != nil {
			_ = conn.CloseDeadline(time.Now().Add(time.Second))
			return p.unavailable(err)
		}
	}
	p.conn, p.blocked = conn, blocked
	return nil
}

// rpc runs f, which waits for the broker's answers on conn, bounded by ctx:
// when ctx ends first, the broker is taken as unresponsive and conn is
// closed, which ends f.
func rpc(ctx context.Context, conn *amqp.Connection, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = conn.CloseDeadline(time.Now())
		<-done
		return context.Cause(ctx)
	}
}

// session returns a channel in confirm mode, connecting if need be.
func (p *Publisher) session(ctx context.Context) (*session, error) {
	p.mu.Lock()
	if err := p.connectLocked(ctx); err != nil {
		p.mu.Unlock()
		return nil, err
	}
	for len(p.idle) > 0 {
		s := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !s.ch.IsClosed() {
			p.mu.Unlock()
			return s, nil
		}
	}
	conn, blocked := p.conn, p.blocked
	p.mu.Unlock()
	s := &session{conn: conn, blocked: blocked}
	err := rpc(ctx, conn, func() error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return fmt.Errorf("confirm mode: %w", err)
		}
		s.ch = ch
		s.returns = ch.NotifyReturn(make(chan amqp.Return, returnsBuffer))
		s.closes = ch.NotifyClose(make(chan *amqp.Error, 1))
		return nil
	})
	if err != nil {
		return nil, p.unavailable(fmt.Errorf("open channel: %w", err))
	}
	return s, nil
}

// release returns s to the pool, or closes it when it is not clean: a
// Publish that did not wait for all its confirmations leaves it with
// confirmations or returns still to come.
func (p *Publisher) release(s *session, clean bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if clean && !s.ch.IsClosed() && s.conn == p.conn && len(p.idle) < 16 {
		p.idle = append(p.idle, s)
		return
	}
	go func() { // ends when the channel is closed, which closes s.returns
		for range s.returns {
		}
	}()
	go func() { _ = s.ch.Close() }() // an RPC: ends at the latest with the connection
}

// Publish sends msgs on one channel in confirm mode, each one with the
// mandatory flag and persistent, and waits until the broker confirmed each,
// ConfirmTimeout passed or ctx ended. It returns nil when all were
// confirmed, otherwise one error per message, nil for those confirmed.
//
// Errors are classified for the relay, by whether the refusal depends on
// the message: outbox.Permanent when the message can never be accepted as
// it is (over MaxMessageBytes, a routing key that is not valid),
// outbox.RouteUnavailable, the route being the routing key, when the
// broker refuses everything sent with that routing key for now (returned as
// unroutable, 312 NO_ROUTE: no queue is bound for it; nacked: a queue bound
// to it is full with x-overflow reject-publish, or cannot take messages),
// and outbox.Unavailable when the broker cannot be reached or cannot take
// messages now (no connection, connection lost before the confirmation, no
// confirmation within ConfirmTimeout, the connection blocked by a resource
// alarm, the exchange missing or access refused). Publish does not retry.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	errs := make([]error, len(msgs))
	if ctx.Err() != nil { // ended before anything was sent: the connection stays
		for i := range msgs {
			errs[i] = ctxError(ctx, p, msgs[i])
		}
		return errs
	}
	ctx, cancel := context.WithTimeoutCause(ctx, p.cfg.ConfirmTimeout,
		fmt.Errorf("no confirmation within %s", p.cfg.ConfirmTimeout))
	defer cancel()
	pubs := make([]amqp.Publishing, len(msgs))
	keys := make([]string, len(msgs))
	todo := 0
	for i := range msgs {
		pub, key, err := encode(&msgs[i], p.cfg.RoutingKey, p.cfg.Source)
		if err == nil {
			if verr := pub.Headers.Validate(); verr != nil {
				err = outbox.Permanent(fmt.Errorf("outboxamqp: event %s: application properties: %w", msgs[i].ID, verr))
			} else if n := size(&pub, key); n > p.cfg.MaxMessageBytes {
				err = outbox.Permanent(fmt.Errorf("outboxamqp: event %s: message of about %d bytes (body and properties) exceeds MaxMessageBytes %d",
					msgs[i].ID, n, p.cfg.MaxMessageBytes))
			}
		}
		errs[i], pubs[i], keys[i] = err, pub, key
		if err == nil {
			todo++
		}
	}
	if todo == 0 {
		return errs
	}
	fail := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	s, err := p.session(ctx)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			err = fmt.Errorf("outboxamqp: publish: %w", context.Cause(ctx))
		}
		return fail(err)
	}
	if s.blocked.Load() {
		p.release(s, true)
		return fail(p.unavailable(errors.New("the broker blocked the connection (resource alarm: memory or disk)")))
	}
	clean := s.publish(ctx, p, msgs, pubs, keys, errs)
	p.release(s, clean)
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// publish sends the messages whose errs entry is nil and waits for their
// confirmations, setting errs. It reports whether the channel is clean:
// every message sent was confirmed and its return, if any, received.
func (s *session) publish(ctx context.Context, p *Publisher, msgs []outbox.Message, pubs []amqp.Publishing, keys []string, errs []error) bool {
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	byID := make(map[string][]int, len(msgs)) // message id -> messages sent, for returns
	var sendErr error
	for i := range msgs {
		if errs[i] != nil {
			continue
		}
		if sendErr == nil {
			dcs[i], sendErr = s.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, keys[i], true, false, pubs[i])
			if sendErr == nil && dcs[i] == nil {
				sendErr = errors.New("channel not in confirm mode")
			}
		}
		if sendErr != nil {
			errs[i] = s.classify(ctx, p, fmt.Errorf("publish event %s: %w", msgs[i].ID, sendErr))
			continue
		}
		byID[pubs[i].MessageId] = append(byID[pubs[i].MessageId], i)
	}
	returned := make([]*amqp.Return, len(msgs))
	onReturn := func(r amqp.Return) {
		// A return arrives before the confirmation of its message: it
		// belongs to the first message of its id not yet returned.
		for _, i := range byID[r.MessageId] {
			if returned[i] == nil {
				returned[i] = &r
				return
			}
		}
	}
	clean := sendErr == nil
	returns := s.returns
	for i, dc := range dcs {
		if dc == nil {
			continue
		}
	wait:
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				onReturn(r)
			case <-dc.Done():
				break wait
			case <-ctx.Done():
				clean = false
				for j := i; j < len(dcs); j++ {
					if dcs[j] != nil {
						errs[j] = ctxError(ctx, p, msgs[j])
						dcs[j] = nil
					}
				}
				break wait
			}
		}
		if dcs[i] == nil {
			break
		}
		if !dc.Acked() {
			clean = false
			if s.ch.IsClosed() {
				errs[i] = s.classify(ctx, p, fmt.Errorf("publish event %s: channel closed before the confirmation", msgs[i].ID))
			} else {
				errs[i] = outbox.RouteUnavailable(keys[i], fmt.Errorf("outboxamqp: publish event %s: the broker nacked it (exchange %q, routing key %q: a queue bound for it refused it, full with x-overflow reject-publish, or could not take it)",
					msgs[i].ID, p.cfg.Exchange, keys[i]))
			}
		}
	}
	// Every return was received before its message's confirmation; those
	// still buffered are taken now.
	for drained := returns == nil; !drained; {
		select {
		case r, ok := <-returns:
			if !ok {
				drained = true
				continue
			}
			onReturn(r)
		default:
			drained = true
		}
	}
	for i, r := range returned {
		if r != nil {
			// The route is missing, not the message wrong: bind a queue and
			// every event held for it goes out.
			errs[i] = outbox.RouteUnavailable(keys[i], fmt.Errorf("outboxamqp: event %s returned by the broker: %d %s (exchange %q, routing key %q: no queue is bound for it)",
				msgs[i].ID, r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey))
		}
	}
	return clean
}

// classify marks the error of a message whose channel failed: unavailable
// when the connection is gone or the channel was closed for a reason that
// concerns every message (exchange not found, access refused), otherwise a
// plain error.
func (s *session) classify(ctx context.Context, p *Publisher, err error) error {
	if s.reason == nil {
		select {
		case s.reason = <-s.closes:
		default:
		}
	}
	reason := s.reason
	if reason != nil {
		err = fmt.Errorf("%w: %s", err, reason.Error())
	}
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("outboxamqp: %w", err)
	case s.conn.IsClosed() || reason == nil || reason.Code == amqp.NotFound || reason.Code == amqp.AccessRefused ||
		errors.Is(err, amqp.ErrClosed) || ctx.Err() != nil:
		return p.unavailable(err)
	}
	return fmt.Errorf("outboxamqp: %w", err)
}

// ctxError is the error of a message whose confirmation ctx cut short. A
// deadline (ConfirmTimeout or ctx's) is a broker that does not answer
// (unavailable); a cancellation is returned as is.
func ctxError(ctx context.Context, p *Publisher, msg outbox.Message) error {
	err := fmt.Errorf("publish event %s: %w", msg.ID, context.Cause(ctx))
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return p.unavailable(err)
	}
	return fmt.Errorf("outboxamqp: %w", err)
}
