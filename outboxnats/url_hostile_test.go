package outboxnats_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/secrettest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestParseURLHostileSecrets puts each hostile password or token into
// every place a NATS URL holds one, unencoded, with and without a query
// that ParseURL refuses: neither the error nor the redacted URL (of the
// whole URL, and of the server it returns) shows a 4-byte run of it.
// Before, a token holding '?' or '/' came back in the error as a server
// address or a parameter name, a monitor_url password as the parameter's
// value, and a unicode one in the NATS client's own error.
func TestParseURLHostileSecrets(t *testing.T) {
	t.Parallel()
	templates := []string{
		"nats://relay:%s@127.0.0.1:4222",
		"nats://%s@127.0.0.1:4222",
		"tls://relay:%s@h1:4222,h2:4222",
		"nats://h1:4222,%s@h2:4222",
		"nats://tok@h1:4222, nats://u:%s@h2:4222",
		"nats://127.0.0.1:4222?monitor_url=http://admin:%s@127.0.0.1:8222",
		"nats://127.0.0.1:4222?stream=S&monitor_url=http://%s@127.0.0.1:8222",
	}
	for _, secret := range secrettest.Hostile {
		for _, tmpl := range templates {
			raw := fmt.Sprintf(tmpl, secret)
			for _, raw := range []string{raw, raw + "?bogus=1", raw + "&stream=a.b"} {
				server, _, err := outboxnats.ParseURL(raw)
				shown := map[string]string{"Redact(URL)": outboxnats.Redact(raw)}
				if err != nil {
					shown["error"] = err.Error()
				} else {
					shown["Redact(server)"] = outboxnats.Redact(server)
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
		"nats://h:4222?stream=Qa.Valu3":                   "stream: invalid stream name (value not shown)",
		"nats://h:4222?duplicate_window=Valu3":            "duplicate_window: not a duration",
		"nats://h:4222?max_pending=Valu3":                 "max_pending: not a positive number",
		"nats://h:4222?monitor_url=http://a:Valu3@h:8222": "monitor_url takes no credentials",
		"nats://h:4222?Valu3x=1":                          "Valu3x: unknown parameter",
		"nats://h:4222?Valu3%2F=1":                        "a parameter whose name is not shown: unknown parameter",
		"nats://u:Valu3%zz@h:4222":                        "server 1 of 1 is not a valid URL",
		"nats://h1,u:Valu3ü@h2":                           "server 2 of 2 is not a valid URL",
		"nats://u:Va/lu3@h:4222":                          "not shown as it may hold a token or password",
		"Valu3@h:4222":                                    "not shown",
		"127.0.0.1:4222":                                  "scheme (none)",
	} {
		_, _, err := outboxnats.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
			continue
		}
		if strings.Contains(strings.ReplaceAll(err.Error(), "Valu3x", ""), "Valu3") || strings.Contains(err.Error(), "lu3@") {
			t.Errorf("ParseURL(%q): %v repeats the value", raw, err)
		}
	}
}
