package outboxnats

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/urlopt"
)

// ParseURL splits a destination URL into the NATS server URL to connect to
// and the Config its query describes:
//
//	nats://host:4222?stream=OUTBOX&subject_prefix=outbox&source=/shop&duplicate_window=2m&ack_timeout=10s&max_pending=1024&monitor_url=http://host:8222
//
// The scheme is nats or tls (TLS to the server); user and password, or a
// token, in the URL are passed to the NATS client as they are, and errors
// never repeat the password. ca_file, cert_file and key_file (PEM) set the
// TLS files (Config.ConnectOptions), imply TLS, and are read and checked
// here. monitor_url is the server's HTTP monitoring endpoint
// (http://host:8222), where CheckDurability reads the server's sync
// setting. The host part may list several servers,
// separated by commas. Every query parameter is optional and sets the
// Config field of its name, with the same defaults; unknown parameters are
// refused. The server URL returned has no query.
func ParseURL(raw string) (server string, cfg Config, err error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "nats" && scheme != "tls") {
		return "", cfg, fmt.Errorf("outboxnats: destination URL: scheme %q, want nats://host:port or tls://host:port", scheme)
	}
	hosts, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		hosts, tail = rest[:i], rest[i:]
	}
	server = scheme + "://" + hosts
	shown := Redact(server)
	u, err := url.Parse("nats://h" + tail)
	if err != nil {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: %w", shown, err)
	}
	if (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: unexpected path or fragment (stream and subjects are query parameters)", shown)
	}
	if hosts == "" || strings.HasSuffix(hosts, "@") {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: no server address", shown)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: query: %w", shown, err)
	}
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "stream":
			err = validateStreamName(v)
			cfg.Stream = v
		case "subject_prefix":
			err = validatePrefix(v)
			cfg.SubjectPrefix = v
		case "source":
			cfg.Source = v
		case "duplicate_window":
			cfg.DuplicateWindow, err = urlopt.Duration(v)
		case "ack_timeout":
			cfg.AckTimeout, err = urlopt.Duration(v)
		case "max_pending":
			cfg.MaxPending, err = urlopt.Int(v)
		case "ca_file":
			cfg.CAFile = v
		case "cert_file":
			cfg.CertFile = v
		case "key_file":
			cfg.KeyFile = v
		case "monitor_url":
			err = validateMonitorURL(v)
			cfg.MonitorURL = v
		default:
			err = errors.New("unknown parameter (known: stream, subject_prefix, source, duplicate_window, ack_timeout, max_pending, ca_file, cert_file, key_file, monitor_url)")
		}
		if err != nil {
			return "", Config{}, fmt.Errorf("outboxnats: destination %s: %s=%q: %w", shown, k, v, err)
		}
	}
	if _, err := cfg.ConnectOptions(); err != nil {
		// Read now, so that a bad file stops the relay at start.
		return "", Config{}, fmt.Errorf("outboxnats: destination %s: %s", shown, strings.TrimPrefix(err.Error(), "outboxnats: "))
	}
	return server, cfg, nil
}

// Redact returns a NATS URL (or comma-separated list of servers, each
// with its own user part or scheme) with every password or token in it
// replaced by "xxxxx", for logs and errors.
func Redact(raw string) string { return redact.URL(raw) }

// validateMonitorURL accepts an http or https URL with a host and no query.
func validateMonitorURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return errors.New("not a URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("want the server's monitoring endpoint, http://host:port or https://host:port")
	}
	if u.User != nil {
		return errors.New("NATS monitoring takes no credentials: remove the user from the URL")
	}
	return nil
}
