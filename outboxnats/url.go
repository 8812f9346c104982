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
// token, in the URL are passed to the NATS client as they are (each server
// must parse as a URL: percent-encode what a token or password holds beyond
// letters, digits and -._~). ca_file, cert_file and key_file (PEM) set the
// TLS files (Config.ConnectOptions), imply TLS, and are read and checked
// here. monitor_url is the server's HTTP monitoring endpoint
// (http://host:8222), where CheckDurability reads the server's sync
// setting. The host part may list several servers,
// separated by commas. Every query parameter is optional and sets the
// Config field of its name, with the same defaults; unknown parameters are
// refused. The server URL returned has no query.
//
// Errors never repeat a token or password: they show the URL as Redact
// does and name the parameter and what is wrong, never its value (a TLS
// file's name excepted); a URL in which a token or password may have
// spilled past the server list (an unencoded '/', '?' or '#' in it) or that
// does not parse is not shown at all.
func ParseURL(raw string) (server string, cfg Config, err error) {
	server, cfg, err = parseURL(raw)
	if err != nil && redact.Suspect(raw) {
		return "", Config{}, errors.New("outboxnats: destination URL: not valid, and not shown as it may hold a token or password (percent-encode / ? # @ : % in a token or password; monitor_url takes no credentials)")
	}
	return server, cfg, err
}

func parseURL(raw string) (server string, cfg Config, err error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "nats" && scheme != "tls") {
		return "", cfg, fmt.Errorf("outboxnats: destination URL: scheme %s, want nats://host:port or tls://host:port", redact.Scheme(raw))
	}
	hosts, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		hosts, tail = rest[:i], rest[i:]
	}
	server = scheme + "://" + hosts
	if err := checkServers(scheme, hosts); err != nil {
		// A server that does not parse may be a password's head (an
		// unencoded ',' in it): the URL is not shown.
		return "", cfg, fmt.Errorf("outboxnats: destination URL: not shown as it may hold a token or password: %w", err)
	}
	shown := Redact(server)
	u, err := url.Parse("nats://h" + tail)
	if err != nil {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: the part after the servers is not valid (bad percent-encoding?)", shown)
	}
	if (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: unexpected path or fragment (stream and subjects are query parameters)", shown)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "", cfg, fmt.Errorf("outboxnats: destination %s: query: bad percent-encoding or a ';'", shown)
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
			return "", Config{}, fmt.Errorf("outboxnats: destination %s: %w", shown, redact.Param(k, v, trimPkg(err)))
		}
	}
	if _, err := cfg.ConnectOptions(); err != nil {
		// Read now, so that a bad file stops the relay at start.
		return "", Config{}, fmt.Errorf("outboxnats: destination %s: %w", shown, trimPkg(err))
	}
	return server, cfg, nil
}

// checkServers checks each server of a URL's host part as the NATS client
// will read it (url.Parse, after adding the URL's scheme to a server
// without one), so that the client's error, which quotes the server and its
// token or password, is never the one shown. Its own errors name the
// server by its position only.
func checkServers(scheme, hosts string) error {
	if hosts == "" {
		return errors.New("no server address")
	}
	servers := strings.Split(hosts, ",")
	for i, srv := range servers {
		srv = strings.TrimSpace(srv)
		if !strings.Contains(srv, "://") {
			srv = scheme + "://" + srv
		}
		u, err := url.Parse(srv)
		switch {
		case err != nil:
			return fmt.Errorf("server %d of %d is not a valid URL (percent-encode what a token or password holds beyond letters, digits and -._~)", i+1, len(servers))
		case u.Hostname() == "":
			return fmt.Errorf("server %d of %d: no server address", i+1, len(servers))
		}
	}
	return nil
}

// trimPkg drops the "outboxnats: " of a validator's error, which ParseURL
// wraps in its own.
func trimPkg(err error) error {
	if msg := strings.TrimPrefix(err.Error(), "outboxnats: "); msg != err.Error() {
		return errors.New(msg)
	}
	return err
}

// Redact returns a NATS URL (or comma-separated list of servers, each
// with its own user part or scheme) with every password or token in it
// replaced by "xxxxx", for logs and errors.
func Redact(raw string) string { return redact.URL(raw) }

// validateMonitorURL accepts an http or https URL with a host and no query.
// Its errors do not quote v: credentials in it are refused, and must not be
// shown doing so.
func validateMonitorURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.User != nil {
		return errors.New("NATS monitoring takes no credentials: remove the user from the URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("want the server's monitoring endpoint, http://host:port or https://host:port")
	}
	return nil
}
