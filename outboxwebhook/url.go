package outboxwebhook

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/urlopt"
)

// OptionPrefix starts the query parameters ParseURL takes as options; the
// others belong to the endpoint and stay in Config.URL.
const OptionPrefix = "outbox_"

// ParseURL returns the Config a destination URL describes:
//
//	https://hooks.example.com/outbox?key=abc&outbox_source=/shop&outbox_mode=binary&outbox_timeout=5s&outbox_concurrency=16&outbox_max_response_bytes=65536&outbox_ca_file=/etc/ca.pem&outbox_cert_file=/etc/client.pem&outbox_key_file=/etc/client.key
//
// The URL is the endpoint, http:// or https://. Query parameters whose name
// starts with "outbox_" (OptionPrefix) are options, removed from the URL the
// requests go to: outbox_source, outbox_mode (structured or binary),
// outbox_timeout, outbox_concurrency,
// outbox_max_response_bytes, outbox_ca_file, outbox_cert_file and
// outbox_key_file set the Config field of the same name; an unknown outbox_
// parameter is refused. Every other parameter is the endpoint's own and is
// kept exactly as written. The TLS files are read and checked here (an
// unreadable one is an error naming its option). Credentials in the URL and fragments are
// refused; the signing secrets never go in the URL (see EnvSecret).
//
// Errors show the URL as scheme://host/xxxxx (its path and query may hold
// the endpoint's token) and name the option and what is wrong, never its
// value (a TLS file's name excepted); a URL that does not parse, or with an
// '@' past its host (credentials holding an unencoded '/', '?' or '#',
// refused anyway), is not shown at all.
func ParseURL(raw string) (Config, error) {
	cfg, err := parseURL(raw)
	if err != nil && redact.Suspect(raw) {
		return Config{}, errors.New("outboxwebhook: destination URL: not valid, and not shown as it may hold credentials (credentials in the URL are refused: the signature authenticates the sender)")
	}
	return cfg, err
}

func parseURL(raw string) (Config, error) {
	var cfg Config
	shown := redactURL(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return cfg, fmt.Errorf("outboxwebhook: destination URL %s: not a URL", shown)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return cfg, fmt.Errorf("outboxwebhook: destination URL: scheme %s, want http:// or https://", redact.Scheme(raw))
	}
	if u.User != nil {
		return cfg, fmt.Errorf("outboxwebhook: destination %s: credentials in the URL are refused (the signature authenticates the sender)", shown)
	}
	if u.Host == "" || u.Hostname() == "" {
		return cfg, fmt.Errorf("outboxwebhook: destination %s: no host", shown)
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return cfg, fmt.Errorf("outboxwebhook: destination %s: unexpected fragment", shown)
	}
	var kept []string
	for _, pair := range strings.Split(u.RawQuery, "&") {
		if pair == "" {
			continue
		}
		rk, rv, _ := strings.Cut(pair, "=")
		k, err1 := url.QueryUnescape(rk)
		if err1 != nil || !strings.HasPrefix(k, OptionPrefix) {
			kept = append(kept, pair)
			continue
		}
		v, err := url.QueryUnescape(rv)
		if err != nil {
			err = errors.New("bad percent-encoding")
		} else {
			err = setOption(&cfg, strings.TrimPrefix(k, OptionPrefix), v)
		}
		if err != nil {
			return Config{}, fmt.Errorf("outboxwebhook: destination %s: %w", shown, redact.Param(k, v, err))
		}
	}
	if err := cfg.tlsFiles().Check(); err != nil {
		// Read now, so that a bad file stops the relay at start.
		return Config{}, fmt.Errorf("outboxwebhook: destination %s: %w", shown, err)
	}
	u.RawQuery = strings.Join(kept, "&")
	u.ForceQuery = false
	cfg.URL = u.String()
	return cfg, nil
}

func setOption(cfg *Config, name, v string) error {
	var err error
	switch name {
	case "source":
		cfg.Source = v
	case "mode":
		cfg.Mode, err = parseMode(v)
	case "timeout":
		cfg.Timeout, err = urlopt.Duration(v)
	case "concurrency":
		cfg.Concurrency, err = urlopt.Int(v)
	case "max_response_bytes":
		cfg.MaxResponseBytes, err = urlopt.Int64(v)
	case "ca_file":
		cfg.CAFile = v
	case "cert_file":
		cfg.CertFile = v
	case "key_file":
		cfg.KeyFile = v
	default:
		return errors.New("unknown option (known: outbox_source, outbox_mode, outbox_timeout, outbox_concurrency, outbox_max_response_bytes, outbox_ca_file, outbox_cert_file, outbox_key_file)")
	}
	return err
}
