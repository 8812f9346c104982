package outboxamqp_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/secrettest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestParseURLHostileSecrets puts each hostile password into the URL
// (a user name alone is no secret in an AMQP URL)
// unencoded, with and without a query that ParseURL refuses: neither the
// error, nor the URL as the binaries show it, nor an accepted Config's
// String has a 4-byte run of it. Before, a password holding '?' (or '&'
// and '=' after one) came back as a parameter's name and value, and one
// whose head reads as a port in net/url's "invalid port" error.
func TestParseURLHostileSecrets(t *testing.T) {
	t.Setenv(outboxamqp.PasswordEnv, "")
	for _, secret := range secrettest.Hostile {
		for _, tmpl := range []string{
			"amqp://relay:%s@mq:5672/",
			"amqps://relay:%s@mq/shop?exchange=x",
			"amqp://relay:%s@mq:5672",
		} {
			raw := fmt.Sprintf(tmpl, secret)
			for _, raw := range []string{raw, raw + "?bogus=1", raw + "&declare=maybe", raw + "#frag"} {
				cfg, err := outboxamqp.ParseURL(raw)
				shown := map[string]string{"redacted URL": redact.URL(raw)}
				if err != nil {
					shown["error"] = err.Error()
				} else {
					shown["Config"] = cfg.String()
				}
				for what, text := range shown {
					if run := secrettest.Leak(text, secret); run != "" {
						t.Errorf("ParseURL(%q): the %s shows %q of the secret: %s", raw, what, run, text)
					}
				}
			}
		}
	}
}

// TestParseURLErrorsNameTheParameter: a refused parameter is named, with
// what is wrong, and its value is not repeated.
func TestParseURLErrorsNameTheParameter(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"amqp://mq/?declare=Valu3":                                "declare: not true or false",
		"amqp://mq/?confirm_timeout=Valu3":                        "confirm_timeout: not a duration",
		"amqp://mq/?routing_key=Valu3" + strings.Repeat("k", 300): "routing_key: not a routing key template",
		"amqp://mq/?Valu3x=1":                                     "Valu3x: unknown parameter",
		"amqp://mq/?password=Valu3":                               "password: unknown parameter",
		"amqp://relay:Valu3ü@mq/":                                 "not shown",
		"amqp://relay:Va?lu3@mq/":                                 "not shown",
		"amqp://relay:Valu3@mq:5672/?check_queues=a,,b":           "check_queues: empty queue name",
		"amqps://relay@mq/?ca_file=/no/Valu3x":                    "ca_file /no/Valu3x: no such file",
	} {
		_, err := outboxamqp.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
			continue
		}
		if strings.Contains(strings.ReplaceAll(err.Error(), "Valu3x", ""), "Valu3") {
			t.Errorf("ParseURL(%q): %v repeats the value", raw, err)
		}
	}
}
