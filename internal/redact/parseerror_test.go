package redact

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/secrettest"
)

// TestURLHidesHostileSecrets: URL and Webhook show no 4-byte run of a
// password or token holding, unencoded, what ends or splits a URL's parts.
// Before, a NATS token holding '?' was shown whole (as a server address
// followed by a query), and a webhook's credentials' head as its host or
// port.
func TestURLHidesHostileSecrets(t *testing.T) {
	t.Parallel()
	for _, secret := range secrettest.Hostile {
		for _, tmpl := range []string{
			"nats://%s@h:4222", "nats://relay:%s@h:4222?stream=S", "tls://h1,%s@h2", "nats://u:%s@h1:4222, nats://t@h2",
			"nats://h?monitor_url=http://a:%s@m:8222", "amqp://relay:%s@mq/", "kafka://relay:%s@k1,k2?sasl=plain",
			"postgres://app:%s@db/shop", "https://%s@h/x", "https://u:%s@h/x", "https://h/p/%s",
		} {
			raw := strings.Replace(tmpl, "%s", secret, 1)
			for name, got := range map[string]string{"URL": URL(raw), "Database": Database(raw)} {
				if run := secrettest.Leak(got, secret); run != "" {
					t.Errorf("%s(%q) = %q: shows %q of the secret", name, raw, got, run)
				}
			}
		}
	}
}

func TestSuspect(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		"nats://tok?x@h":                         true,
		"nats://a@h1, nats://b@h2?stream=S":      false,
		"nats://h?monitor_url=http://a:b@m":      true,
		"amqp://u:p@h/vhost":                     false,
		"amqp://u:p/q@h/vhost":                   true,
		"https://h/x?email=a@b":                  true,
		"s3cret@h":                               true,
		"h:4222":                                 false,
		"postgres://app:pw@db/shop?sslmode=none": false,
	} {
		if got := Suspect(raw); got != want {
			t.Errorf("Suspect(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestUnencodedSlash(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		"postgres://app:20247/S3cret@db/shop":                 true,
		"postgres://app:pw/S3cret?x@db/shop":                  true,
		"postgres://app:pw@db/shop":                           false,
		"postgres://db:5432/shop?application_name=a@b":        true, // write %40
		"postgres://app:pw@db:5432/shop?application_name=a@b": false,
		"host=db password=a/b@c":                              false,
	} {
		if got := UnencodedSlash(raw); got != want {
			t.Errorf("UnencodedSlash(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestParam(t *testing.T) {
	t.Parallel()
	err := Param("stream", "Valu3.x", errors.New(`outboxnats: invalid stream name "Valu3.x": no '.'`))
	if got := err.Error(); got != `stream: outboxnats: invalid stream name (value not shown): no '.'` {
		t.Errorf("Param = %q", got)
	}
	if got := Param("S3cr?t", "", errors.New("unknown parameter")).Error(); strings.Contains(got, "S3cr") {
		t.Errorf("Param shows a name that is not a plain name: %q", got)
	}
}
