package outboxkafka

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/urlopt"
)

// DefaultPort is the broker port of a URL host without one.
const DefaultPort = "9092"

// PasswordEnv names the environment variable ParseURL takes the SASL
// password from when the URL names a user without one.
const PasswordEnv = "OUTBOX_KAFKA_PASSWORD"

// ParseURL returns the Config a destination URL describes:
//
//	kafka://host1:9092,host2:9092?topic=outbox.{aggregate_type}&source=/shop&delivery_timeout=10s&dial_timeout=5s&max_record_bytes=1000000
//	kafka://relay@host1:9092,host2:9092?sasl=scram-sha-512&tls=true&ca_file=/etc/kafka/ca.pem&cert_file=/etc/relay.pem&key_file=/etc/relay.key
//
// The host part lists the seed brokers, separated by commas (port 9092 when
// left out); every query parameter is optional and sets the Config field of
// its name, with the same defaults. A user before the brokers is the SASL
// user, and then sasl= (plain, scram-sha-256 or scram-sha-512) is required;
// its password is taken from the environment variable OUTBOX_KAFKA_PASSWORD,
// so that it need not appear in a command line, unless the URL has one
// (user:password@, percent-encoded). tls=true dials the brokers with TLS,
// verified against the system's roots or ca_file (PEM); cert_file and
// key_file (PEM, both or neither) are the client's certificate; the files
// are read and checked here, so that a bad one is an error at once (naming
// the option and the file). Unknown parameters are refused.
//
// Errors never repeat the password: they show the URL without it and name
// the parameter and what is wrong, never its value (a TLS file's name
// excepted); a URL in which the password may have spilled past the broker
// list (an unencoded '/', '?' or '#' in it) is not shown at all.
func ParseURL(raw string) (Config, error) {
	cfg, err := parseURL(raw)
	if err != nil && redact.Suspect(raw) {
		// An unencoded / ? or # in a password ends the broker list early,
		// and the error would quote what follows.
		return Config{}, errors.New("outboxkafka: destination URL: not valid, and not shown as it may hold a password (percent-encode / ? # : @ in a password, or use " + PasswordEnv + ")")
	}
	return cfg, err
}

func parseURL(raw string) (Config, error) {
	var cfg Config
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme != "kafka" {
		return cfg, fmt.Errorf("outboxkafka: destination URL: scheme %s, want kafka://host:port", redact.Scheme(raw))
	}
	// url.Parse takes one host only: the broker list is split here.
	hosts, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		hosts, tail = rest[:i], rest[i:]
	}
	shown := "kafka://" + hosts
	if i := strings.LastIndex(hosts, "@"); i >= 0 {
		userinfo := hosts[:i]
		hosts = hosts[i+1:]
		rawUser, rawPassword, hasPassword := strings.Cut(userinfo, ":")
		shown = "kafka://" + rawUser + "@" + hosts
		if hasPassword {
			shown = "kafka://" + rawUser + ":xxxxx@" + hosts
		}
		var err error
		if cfg.User, err = url.PathUnescape(rawUser); err != nil || cfg.User == "" {
			return Config{}, fmt.Errorf("outboxkafka: destination %s: bad user name", shown)
		}
		if hasPassword {
			// The unescape error would quote part of the password.
			if cfg.Password, err = url.PathUnescape(rawPassword); err != nil {
				return Config{}, fmt.Errorf("outboxkafka: destination %s: bad percent-encoding in the password", shown)
			}
		}
	}
	u, err := url.Parse("kafka://h" + tail)
	if err != nil {
		return cfg, fmt.Errorf("outboxkafka: destination %s: the part after the brokers is not valid (bad percent-encoding?)", shown)
	}
	if u.Path != "" && u.Path != "/" {
		return cfg, fmt.Errorf("outboxkafka: destination %s: unexpected path (the topic is the topic parameter)", shown)
	}
	if u.Fragment != "" {
		return cfg, fmt.Errorf("outboxkafka: destination %s: unexpected fragment", shown)
	}
	for _, b := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			host, port = strings.TrimSuffix(strings.TrimPrefix(b, "["), "]"), DefaultPort
		}
		if host == "" || strings.ContainsAny(host, "[]/ ") {
			return cfg, fmt.Errorf("outboxkafka: destination %s: bad broker address %q", shown, b)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return cfg, fmt.Errorf("outboxkafka: destination %s: broker %q: bad port", shown, b)
		}
		cfg.Brokers = append(cfg.Brokers, net.JoinHostPort(host, port))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return cfg, fmt.Errorf("outboxkafka: destination %s: query: bad percent-encoding or a ';'", shown)
	}
	tlsOff := false
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "topic":
			cfg.Topic = v
		case "source":
			cfg.Source = v
		case "delivery_timeout":
			cfg.DeliveryTimeout, err = urlopt.Duration(v)
		case "dial_timeout":
			cfg.DialTimeout, err = urlopt.Duration(v)
		case "max_record_bytes":
			cfg.MaxRecordBytes, err = urlopt.Int(v)
		case "sasl":
			cfg.SASLMechanism, err = saslMechanism(v)
		case "tls":
			cfg.TLS, err = urlopt.Bool(v)
			tlsOff = err == nil && !cfg.TLS
		case "ca_file":
			cfg.CAFile = v
		case "cert_file":
			cfg.CertFile = v
		case "key_file":
			cfg.KeyFile = v
		default:
			err = errors.New("unknown parameter (known: topic, source, delivery_timeout, dial_timeout, max_record_bytes, sasl, tls, ca_file, cert_file, key_file)")
		}
		if err != nil {
			return Config{}, fmt.Errorf("outboxkafka: destination %s: %w", shown, redact.Param(k, v, err))
		}
	}
	if cfg.Topic != "" {
		if _, err := Topic(cfg.Topic, "t"); err != nil {
			return Config{}, fmt.Errorf("outboxkafka: destination %s: %w", shown, redact.Param("topic", cfg.Topic, err))
		}
	}
	if tlsOff && (cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "") {
		return Config{}, fmt.Errorf("outboxkafka: destination %s: tls=false with ca_file, cert_file or key_file", shown)
	}
	if (cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "") && !tlsOff {
		cfg.TLS = true
	}
	switch {
	case cfg.User != "" && cfg.SASLMechanism == "":
		return Config{}, fmt.Errorf("outboxkafka: destination %s: a user needs sasl=plain, sasl=scram-sha-256 or sasl=scram-sha-512", shown)
	case cfg.User == "" && cfg.SASLMechanism != "":
		return Config{}, fmt.Errorf("outboxkafka: destination %s: sasl=%s needs a user (kafka://user@host:9092, the password in %s)", shown, strings.ToLower(cfg.SASLMechanism), PasswordEnv)
	case cfg.User != "" && cfg.Password == "":
		cfg.Password = os.Getenv(PasswordEnv)
		if cfg.Password == "" {
			return Config{}, fmt.Errorf("outboxkafka: destination %s: no password for user %q: set %s", shown, cfg.User, PasswordEnv)
		}
	}
	if err := cfg.tlsFiles().Check(); err != nil {
		// Read now, so that a bad file stops the relay at start.
		return Config{}, fmt.Errorf("outboxkafka: destination %s: %w", shown, err)
	}
	if err := cfg.check(); err != nil {
		return Config{}, fmt.Errorf("outboxkafka: destination %s: %s", shown, strings.TrimPrefix(err.Error(), "outboxkafka: "))
	}
	return cfg, nil
}

// saslMechanism returns the Config.SASLMechanism a sasl= parameter names.
func saslMechanism(v string) (string, error) {
	for _, m := range []string{SASLPlain, SASLScramSHA256, SASLScramSHA512} {
		if strings.EqualFold(v, m) {
			return m, nil
		}
	}
	return "", errors.New("unknown SASL mechanism (known: plain, scram-sha-256, scram-sha-512)")
}
