package outboxkafka_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/secrettest"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestParseURLHostileSecrets puts each hostile password into the URL
// unencoded, with and without a query that ParseURL refuses: neither the
// error nor the URL as the binaries show it has a 4-byte run of it.
func TestParseURLHostileSecrets(t *testing.T) {
	t.Setenv(outboxkafka.PasswordEnv, "")
	for _, secret := range secrettest.Hostile {
		for _, tmpl := range []string{
			"kafka://relay:%s@k1:9092?sasl=plain",
			"kafka://relay:%s@k1:9092,k2?sasl=scram-sha-512&tls=maybe",
			"kafka://relay:%s@k1:9092",
		} {
			raw := fmt.Sprintf(tmpl, secret)
			for _, raw := range []string{raw, raw + "&bogus=1", raw + "?topic=a%20b"} {
				_, err := outboxkafka.ParseURL(raw)
				shown := map[string]string{"redacted URL": redact.URL(raw)}
				if err != nil {
					shown["error"] = err.Error()
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
		"kafka://k1?topic=Valu3%20x":        "topic: aggregate type \"t\": topic name (value not shown)",
		"kafka://k1?delivery_timeout=Valu3": "delivery_timeout: not a duration",
		"kafka://k1?tls=Valu3":              "tls: not true or false",
		"kafka://k1?sasl=Valu3":             "sasl: unknown SASL mechanism",
		"kafka://k1?Valu3x=1":               "Valu3x: unknown parameter",
		"kafka://k1/Valu3":                  "unexpected path",
		"Valu3@k1":                          "not shown",
	} {
		_, err := outboxkafka.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
			continue
		}
		if strings.Contains(strings.ReplaceAll(err.Error(), "Valu3x", ""), "Valu3") {
			t.Errorf("ParseURL(%q): %v repeats the value", raw, err)
		}
	}
}
