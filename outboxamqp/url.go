package outboxamqp

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	iredact "github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/urlopt"
)

// PasswordEnv names the environment variable ParseURL takes the password
// from when the URL names a user without one.
const PasswordEnv = "OUTBOX_AMQP_PASSWORD"

// ParseURL returns the Config a destination URL describes:
//
//	amqp://user:password@host:5672/vhost?exchange=outbox&routing_key=outbox.{aggregate_type}&source=/shop&confirm_timeout=10s&dial_timeout=5s&max_message_bytes=16777216&declare=true
//
// or amqps://...?ca_file=/etc/ca.pem&cert_file=/etc/relay.pem&key_file=/etc/relay.key
// for TLS (port 5671 when left out), verified against the system's roots or
// ca_file's, with a client certificate when cert_file and key_file name
// one; the files are read and checked here. The user, host, port and
// virtual host are amqp091's (a path "/" or none is the default vhost "/";
// "/shop" is "shop"; guest:guest when no user is named). When the URL names
// a user without a password, the password is taken from the environment
// variable OUTBOX_AMQP_PASSWORD, so that it need not appear in a command
// line. The query parameters are optional and set the Config field of their
// name (declare=false sets NoDeclare; check_queues=q1,q2 sets CheckQueues,
// the queues the relay's start-up check inspects); unknown parameters are
// refused.
//
// Errors never repeat the password: they show the URL without it and name
// the parameter and what is wrong, never its value (a TLS file's name
// excepted); a URL that does not parse, or in which the password may have
// spilled past the host (an unencoded '/', '?' or '#' in it: a parser would
// take its head for a port, its tail for the path or query), is not shown
// at all.
func ParseURL(raw string) (Config, error) {
	cfg, err := parseURL(raw)
	if err != nil && iredact.Suspect(raw) {
		return Config{}, errors.New("outboxamqp: destination URL: not valid, and not shown as it may hold a password (percent-encode / ? # @ : % & = in a password, or use " + PasswordEnv + ")")
	}
	return cfg, err
}

func parseURL(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the URL, and its inner error may quote a
		// piece of the password (as an "invalid port").
		return Config{}, errors.New("outboxamqp: destination URL: not valid, and not shown as it may hold a password (percent-encode / ? # @ : % in a password, or use " + PasswordEnv + ")")
	}
	// The query is left out: the error names the parameter it is about.
	shown := redact((&url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String())
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return Config{}, fmt.Errorf("outboxamqp: destination %s: scheme %s, want amqp:// or amqps://", shown, iredact.Scheme(raw))
	}
	if u.Host == "" {
		return Config{}, fmt.Errorf("outboxamqp: destination %s: no host", shown)
	}
	if u.Fragment != "" {
		return Config{}, fmt.Errorf("outboxamqp: destination %s: unexpected fragment", shown)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Config{}, fmt.Errorf("outboxamqp: destination %s: query: bad percent-encoding or a ';'", shown)
	}
	var cfg Config
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "exchange":
			cfg.Exchange = v
		case "routing_key":
			// Checked here too, so that the error names the parameter
			// without quoting it (NewPublisher's quotes the template).
			cfg.RoutingKey = v
			if _, err = RoutingKey(v, "t", "i"); err != nil {
				err = fmt.Errorf("not a routing key template: over %d bytes, or not UTF-8", maxShortString)
			}
		case "source":
			cfg.Source = v
		case "confirm_timeout":
			cfg.ConfirmTimeout, err = urlopt.Duration(v)
		case "dial_timeout":
			cfg.DialTimeout, err = urlopt.Duration(v)
		case "max_message_bytes":
			cfg.MaxMessageBytes, err = urlopt.Int(v)
		case "ca_file":
			cfg.CAFile = v
		case "cert_file":
			cfg.CertFile = v
		case "key_file":
			cfg.KeyFile = v
		case "check_queues":
			cfg.CheckQueues, err = parseQueueList(v)
		case "declare":
			var declare bool
			declare, err = urlopt.Bool(v)
			cfg.NoDeclare = !declare
		default:
			err = errors.New("unknown parameter (known: exchange, routing_key, source, confirm_timeout, dial_timeout, max_message_bytes, declare, check_queues, ca_file, cert_file, key_file)")
		}
		if err != nil {
			return Config{}, fmt.Errorf("outboxamqp: destination %s: %w", shown, iredact.Param(k, v, err))
		}
	}
	if u.User != nil {
		if _, ok := u.User.Password(); !ok {
			if pw, ok := os.LookupEnv(PasswordEnv); ok {
				u.User = url.UserPassword(u.User.Username(), pw)
			}
		}
	}
	u.RawQuery = ""
	cfg.URL = u.String()
	if _, err := NewPublisher(cfg); err != nil {
		return Config{}, fmt.Errorf("outboxamqp: destination %s: %s", shown, strings.TrimPrefix(err.Error(), "outboxamqp: "))
	}
	return cfg, nil
}

// parseQueueList splits check_queues: queue names separated by commas.
func parseQueueList(v string) ([]string, error) {
	var out []string
	for _, q := range strings.Split(v, ",") {
		q = strings.TrimSpace(q)
		switch {
		case q == "":
			return nil, errors.New("empty queue name")
		case len(q) > maxShortString:
			return nil, fmt.Errorf("queue name of %d bytes exceeds AMQP's %d", len(q), maxShortString)
		}
		out = append(out, q)
	}
	return out, nil
}
