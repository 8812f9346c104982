package outboxamqp_test

import (
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/outboxamqp"
)

// Security review of issue 19, item 11: ParseURL's errors show the URL as
// every binary does (internal/redact): a URL of another scheme given by
// mistake keeps its NATS tokens and webhook path out of the error. Before,
// net/url's Redacted() showed both.
func TestParseURLErrorHidesOtherSchemesSecrets(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"nats://tok-s3cret@h1,tok2-s3cret@h2",
		"https://hooks.slack.com/services/T0/B0/s3cret",
		"amqp://g:s3cret@h/?bogus=1",
	} {
		_, err := outboxamqp.ParseURL(raw)
		if err == nil || strings.Contains(err.Error(), "s3") {
			t.Errorf("ParseURL(%q): %v", raw, err)
		}
	}
}
