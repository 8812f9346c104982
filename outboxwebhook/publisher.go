package outboxwebhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

// Defaults for Config.
const (
	SourceDefault           = "/outbox"
	TimeoutDefault          = 10 * time.Second
	ConcurrencyDefault      = 16
	MaxResponseBytesDefault = 64 << 10
)

// errorBodyBytes is how much of a response body an error quotes.
const errorBodyBytes = 1024

// userAgent is the User-Agent of the requests.
const userAgent = "pgoutbox-webhook/1"

// Config configures a Publisher. Only URL is required, and a signing
// secret (Secrets, or the EnvSecret environment variable).
type Config struct {
	// URL is the endpoint every event is POSTed to, http:// or https://,
	// with its own query if it has one. Credentials in it are refused.
	URL string
	// Secrets are the Standard Webhooks signing secrets ("whsec_" and
	// base64 of at least MinSecretBytes bytes): each adds one v1 signature,
	// so that a receiver can move from an old secret to a new one while
	// both are listed. When empty, NewPublisher reads EnvSecret. At least
	// one is required. They are never printed.
	Secrets []string
	// Source is the CloudEvents "source" attribute. Defaults to
	// SourceDefault.
	Source string
	// Mode is how requests carry events: Structured (the default: one
	// signed JSON object) or Binary (payload as the body, attributes in
	// ce- headers signed by webhook-outbox-signature).
	Mode Mode
	// Timeout bounds one request, from connecting to reading the response.
	// Defaults to TimeoutDefault.
	Timeout time.Duration
	// Concurrency bounds how many requests one Publish call has in flight.
	// Defaults to ConcurrencyDefault.
	Concurrency int
	// MaxResponseBytes is the most of a response body read; an error
	// quotes at most its first KiB. Defaults to MaxResponseBytesDefault.
	MaxResponseBytes int64
	// CAFile is a PEM file of the certificate authorities trusted for an
	// https endpoint, instead of the system's. Empty: the system's.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// endpoints that require one (mutual TLS). Both or neither.
	CertFile, KeyFile string
	// Client, when set, sends the requests instead of a client built from
	// CAFile, CertFile and KeyFile (which must then be empty). The
	// publisher uses a copy that never follows redirects; its Timeout
	// field is left as it is (Timeout above bounds each request anyway).
	Client *http.Client
}

func (c Config) withDefaults() Config {
	if c.Source == "" {
		c.Source = SourceDefault
	}
	if c.Mode == "" {
		c.Mode = Structured
	}
	if c.Timeout <= 0 {
		c.Timeout = TimeoutDefault
	}
	if c.Concurrency <= 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = MaxResponseBytesDefault
	}
	return c
}

// String describes the configuration without the secrets and without the
// endpoint's query (which may hold a token).
func (c Config) String() string {
	return fmt.Sprintf("outboxwebhook.Config{URL: %s, Secrets: %d, Source: %q, Mode: %q, Timeout: %s, Concurrency: %d, MaxResponseBytes: %d, CAFile: %q, CertFile: %q, KeyFile: %q}",
		redactURL(c.URL), len(c.Secrets), c.Source, c.Mode, c.Timeout, c.Concurrency, c.MaxResponseBytes, c.CAFile, c.CertFile, c.KeyFile)
}

// GoString is String, so that %#v does not print the secrets either.
func (c Config) GoString() string { return c.String() }

// redactURL returns raw as redact.Webhook shows it: scheme://host and, for
// a path, /xxxxx (Slack- and Discord-style URLs put their token in the
// path); no credentials, query or fragment.
func redactURL(raw string) string { return redact.Webhook(raw) }

// urlSecrets returns what of u may be a secret, for redact.Secrets: its
// path (as sent and decoded), each path segment of 16 bytes or more (a
// token), and the values of its query; and its host and port when an '@'
// follows them (redact.Suspect): then they may be the head of credentials
// holding an unencoded '/', '?' or '#', which a dial error would quote.
func urlSecrets(u *url.URL) []string {
	var out []string
	if redact.Suspect(u.String()) {
		out = append(out, u.Host, u.Hostname(), u.Port())
	}
	if u.Path != "" && u.Path != "/" {
		out = append(out, u.EscapedPath(), u.Path)
		for _, seg := range strings.Split(u.Path, "/") {
			if len(seg) >= 16 {
				out = append(out, seg)
			}
		}
	}
	for _, vs := range u.Query() {
		out = append(out, vs...)
	}
	return out
}

// Publisher POSTs outbox messages to one HTTP endpoint as CloudEvents, in
// structured mode unless Config.Mode says binary, signed as Standard
// Webhooks (see the package documentation).
// It implements outbox.Publisher and outbox.Prober and is safe for
// concurrent use.
type Publisher struct {
	cfg   Config
	url   *url.URL
	shown string
	// urlSecrets are the parts of the URL an answer's body may echo (a
	// "Cannot POST /services/T…/B…/<token>" page): hidden in errors.
	urlSecrets []string
	keys       [][]byte
	client     *http.Client
	now        func() time.Time
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Prober    = (*Publisher)(nil)
)

// NewPublisher checks cfg, decodes the secrets (from EnvSecret when
// cfg.Secrets is empty) and builds the HTTP client. It does not connect:
// Probe does. A malformed secret is an error that does not repeat it.
func NewPublisher(cfg Config) (*Publisher, error) {
	cfg = cfg.withDefaults()
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("outboxwebhook: URL %s: want http://host/path or https://host/path", redactURL(cfg.URL))
	}
	shown := redactURL(cfg.URL)
	if u.User != nil {
		return nil, fmt.Errorf("outboxwebhook: URL %s: credentials in the URL are refused", shown)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("outboxwebhook: URL %s: unexpected fragment", shown)
	}
	if cfg.Mode, err = parseMode(string(cfg.Mode)); err != nil {
		return nil, fmt.Errorf("outboxwebhook: Config.Mode: %w", err)
	}
	if len(cfg.Secrets) == 0 {
		cfg.Secrets = SecretsFromEnv()
	}
	if len(cfg.Secrets) == 0 {
		return nil, fmt.Errorf("outboxwebhook: no signing secret: set %s (whsec_...) or Config.Secrets", EnvSecret)
	}
	keys, err := parseSecrets(cfg.Secrets)
	if err != nil {
		return nil, err
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, url: u, shown: shown, urlSecrets: urlSecrets(u), keys: keys, client: client, now: time.Now}, nil
}

// tlsFiles are the CA and client certificate files, named as the URL's
// options in errors.
func (c Config) tlsFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: c.CAFile, Cert: c.CertFile, Key: c.KeyFile, Prefix: OptionPrefix}
}

// noRedirect makes a client return a redirect response as it is.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func newClient(cfg Config) (*http.Client, error) {
	if cfg.Client != nil {
		if cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
			return nil, errors.New("outboxwebhook: Config.Client and CAFile, CertFile or KeyFile are exclusive: configure the client's transport")
		}
		c := *cfg.Client
		c.CheckRedirect = noRedirect
		return &c, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = cfg.Concurrency
	tlsCfg, err := cfg.tlsFiles().Config(nil)
	if err != nil {
		return nil, fmt.Errorf("outboxwebhook: %w", err)
	}
	tr.TLSClientConfig = tlsCfg
	return &http.Client{Transport: tr, CheckRedirect: noRedirect}, nil
}

// String names the endpoint (scheme, host and path only).
func (p *Publisher) String() string { return "webhook " + p.shown }

// Close closes the client's idle connections.
func (p *Publisher) Close() { p.client.CloseIdleConnections() }

// Publish POSTs each message, up to Config.Concurrency at a time, and waits
// until each one was answered, failed, or ctx ended. It returns nil when
// every endpoint answer was 2xx, otherwise one error per message, nil for
// those accepted. It never retries (the relay does); see the package
// documentation for how failures are classified.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	if len(msgs) == 0 {
		return nil
	}
	errs := make([]error, len(msgs))
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range msgs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			errs[i] = ctxError(ctx)
			continue
		}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			errs[i] = p.post(ctx, &msgs[i])
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// post sends one message and classifies the outcome.
func (p *Publisher) post(parent context.Context, msg *outbox.Message) error {
	req, err := p.request(parent, msg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(req.Context(), p.cfg.Timeout)
	defer cancel()
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	resp, err := p.client.Do(req.WithContext(ctx))
	if err != nil {
		if parent.Err() != nil {
			return ctxError(parent)
		}
		return p.transportError(fmt.Sprintf("post event %s", msg.ID), err, connected.Load())
	}
	defer resp.Body.Close()
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, p.cfg.MaxResponseBytes))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil // accepted, even if the body could not be read whole
	}
	se := &StatusError{StatusCode: resp.StatusCode, Status: resp.Status, URL: p.shown, EventID: msg.ID.String(),
		Body: redact.Secrets(quote(body, readErr), p.urlSecrets...)}
	return classifyStatus(se, resp, p.now())
}

// throttleDefault is the pause a 429 without Retry-After asks for.
const throttleDefault = time.Second

// classifyStatus marks a non-2xx answer by whether it depends on the event
// (see the package documentation, and docs/destinations.md). Every event
// goes to the same URL, so an answer about the URL (moved, not there, not
// authorized, throttled, down) is the endpoint's, not the event's: it is
// unavailable, spends no attempt, and never quarantines. The relay still
// counts it against an event that alone gets it while others are accepted,
// claim after claim (a receiver that answers 404 or 403 about that event).
func classifyStatus(se *StatusError, resp *http.Response, now time.Time) error {
	unavailable := outbox.Unavailable
	retryable := func(err error) error { return err }
	switch code := resp.StatusCode; {
	case code >= 300 && code < 400:
		// The endpoint moved: every event would follow; none is wrong.
		se.Location = redactURL(resp.Header.Get("Location"))
		return outbox.Unavailable(se)
	case code == http.StatusTooManyRequests:
		// Throttled: the endpoint asks the client, not this event, to slow
		// down. Without a Retry-After, a second.
		err := withRetryAfter(se, resp, now, unavailable)
		if !se.HasRetryAfter {
			err = outbox.Unavailable(outbox.RetryAfter(se, throttleDefault))
		}
		return err
	case code == http.StatusBadGateway, code == http.StatusServiceUnavailable, code == http.StatusGatewayTimeout:
		// The service behind the URL is down: the endpoint as a whole, not
		// this event. Retried without spending an attempt.
		return withRetryAfter(se, resp, now, unavailable)
	case code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusNotFound,
		code == http.StatusMethodNotAllowed, code == http.StatusGone:
		// Not authorized (a secret the receiver does not know), no such
		// endpoint (a wrong path, a receiver not deployed): fixed by
		// configuration, not by changing the event.
		return withRetryAfter(se, resp, now, unavailable)
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code >= 500:
		return withRetryAfter(se, resp, now, retryable)
	case code >= 400:
		return outbox.Permanent(se) // the endpoint refused this event: 400, 413, 415, 422, ...
	}
	return se // 1xx or beyond 599: retryable
}

// transportError classifies a request that got no response: no connection
// (DNS, refused, TLS handshake, timeout while connecting) is
// outbox.Unavailable; a failure after the connection was made (reset,
// timeout waiting for the answer) may have reached the endpoint and is a
// plain, retryable error. The URL (whose query may hold a token) is left
// out.
func (p *Publisher) transportError(what string, err error, connected bool) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	err = redact.Error(fmt.Errorf("outboxwebhook: %s to %s: %w", what, p.shown, err), p.urlSecrets...)
	if !connected {
		return outbox.Unavailable(err)
	}
	return err
}

// ctxError is the error of a message whose publish ctx cut short. A
// deadline is a timeout waiting for the endpoint (unavailable); a
// cancellation is returned as is.
func ctxError(ctx context.Context) error {
	err := fmt.Errorf("outboxwebhook: publish: %w", context.Cause(ctx))
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return outbox.Unavailable(err)
	}
	return err
}

// quote is the start of a response body, for an error.
func quote(body []byte, readErr error) string {
	s := strings.ToValidUTF8(string(body), "?")
	if len(body) > errorBodyBytes {
		s = strings.ToValidUTF8(string(body[:errorBodyBytes]), "?") + "... (truncated)"
	}
	if readErr != nil {
		s += fmt.Sprintf(" (reading the body: %v)", readErr)
	}
	return s
}

// StatusError is the error of a request the endpoint answered with a
// status other than 2xx. Publish returns it marked outbox.Unavailable for
// answers about the endpoint rather than the event: 429 (throttled), 502,
// 503 and 504 (down), 401, 403, 404, 405 and 410 (not authorized, not
// there) and 3xx (moved; redirects are not followed); as it is (retryable)
// for 408, 425 and other 5xx; and marked outbox.Permanent for the other 4xx
// (the endpoint refused this event). It carries outbox.RetryAfter when the
// response had a Retry-After header, and a 429 without one a second.
// errors.As finds it either way.
type StatusError struct {
	// StatusCode and Status are the response's.
	StatusCode int
	Status     string
	// URL is the endpoint, without its query.
	URL string
	// EventID is the event posted.
	EventID string
	// Body is the start of the response body (at most 1 KiB of it).
	Body string
	// Location is the target of a redirect (3xx), without its query.
	Location string
	// RetryAfter is the delay the endpoint asked for with a Retry-After
	// header (seconds or an HTTP date), when HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
}

func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "outboxwebhook: post event %s to %s: %s", e.EventID, e.URL, e.Status)
	if e.StatusCode >= 300 && e.StatusCode < 400 {
		fmt.Fprintf(&b, " (redirect to %s not followed: point the destination at the final URL)", e.Location)
	}
	if e.HasRetryAfter {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	if e.Body != "" {
		fmt.Fprintf(&b, ": %s", e.Body)
	}
	return b.String()
}

// withRetryAfter reads the response's Retry-After into se and returns se
// marked by class and, when the endpoint asked for a delay, with
// outbox.RetryAfter, which the relay honours.
func withRetryAfter(se *StatusError, resp *http.Response, now time.Time, class func(error) error) error {
	se.RetryAfter, se.HasRetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), now)
	if se.HasRetryAfter {
		return class(outbox.RetryAfter(se, se.RetryAfter))
	}
	return class(se)
}

// RetryAfter returns the delay an endpoint asked for with Retry-After on a
// retryable answer (429, 503, ...), found in err's chain. The relay reads
// the same delay through outbox.RetryDelay and waits at least that long
// before the event's next attempt.
func RetryAfter(err error) (time.Duration, bool) {
	var se *StatusError
	if errors.As(err, &se) && se.HasRetryAfter {
		return se.RetryAfter, true
	}
	return 0, false
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (a date in the past is a zero delay).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}
