package outboxwebhook_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/internal/secrettest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestParseURLHostileSecrets puts each hostile secret where a webhook URL
// holds one (its path, an endpoint's query token) and where credentials
// are refused (the user part), unencoded, with and without an option
// ParseURL refuses: neither the error nor the URL as the binaries show it
// has a 4-byte run of it. Before, credentials holding '?' came back as an
// option's value, and a head of digits as the port.
func TestParseURLHostileSecrets(t *testing.T) {
	t.Parallel()
	for _, secret := range secrettest.Hostile {
		for _, tmpl := range []string{
			"https://hooks.example.com/services/T0/B0/%s",
			"https://hooks.example.com/in?token=%s",
			"https://relay:%s@hooks.example.com/in",
			"https://%s@hooks.example.com/in",
		} {
			raw := fmt.Sprintf(tmpl, secret)
			for _, raw := range []string{raw, raw + "?outbox_timeout=-1s", raw + "&outbox_mode=batch"} {
				_, err := outboxwebhook.ParseURL(raw)
				shown := map[string]string{"redacted URL": redact.URL(raw), "text": redact.Text("post to " + raw + " failed")}
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

// TestParseURLErrorsNameTheOption: a refused option is named, with what is
// wrong, and its value is not repeated.
func TestParseURLErrorsNameTheOption(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"https://h/x?outbox_mode=Valu3":        "outbox_mode: (value not shown) is not a content mode",
		"https://h/x?outbox_timeout=Valu3":     "outbox_timeout: not a duration",
		"https://h/x?outbox_concurrency=Valu3": "outbox_concurrency: not a positive number",
		"https://h/x?outbox_Valu3x=1":          "outbox_Valu3x: unknown option",
		"https://h/x?outbox_timeout=%zzValu3":  "outbox_timeout: bad percent-encoding",
		"https://u:123?outbox_mode=Valu3@h/x":  "not shown",
		"Valu3://h/x":                          "scheme valu3",
	} {
		_, err := outboxwebhook.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
			continue
		}
		if strings.Contains(strings.ReplaceAll(err.Error(), "Valu3x", ""), "Valu3") {
			t.Errorf("ParseURL(%q): %v repeats the value", raw, err)
		}
	}
}
