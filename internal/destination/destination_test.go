package destination

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestErrorsNeverShowTheSecret: whatever is wrong with a destination URL,
// the error names it with the password (or NATS token) taken out.
func TestErrorsNeverShowTheSecret(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{
		"mqtt://user:s3cret@h:1883",
		"nats://user:s3cret@h:4222?stream=a.b",
		"nats://s3cret@h:4222?bogus=1",
		"kafka://user:s3cret@h:9092",
		"amqp://user:s3cret@h:5672/%zz",
		"nats://user:s3cret@h:4222/%zz",
	} {
		_, _, err := Open(ctx, Options{URL: raw})
		if err == nil {
			t.Errorf("Open(%q) succeeded", raw)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q): error shows the secret: %v", raw, err)
		}
	}
	for raw, want := range map[string]string{
		"amqp://guest:s3cret@h:5672/vh":                 "amqp://guest:xxxxx@h:5672/vh",
		"nats://s3cret@h:4222":                          "nats://xxxxx@h:4222",
		"https://u:p@h/hook?token=s3cret":               "https://h/xxxxx",
		"https://hooks.slack.com/services/T0/B0/s3cret": "https://hooks.slack.com/xxxxx",
		"nats://a:s3cret@h1:4222, nats://t0k-s3cret@h2": "nats://a:xxxxx@h1:4222,nats://xxxxx@h2",
	} {
		if got := Redact(raw); got != want {
			t.Errorf("Redact(%q) = %q, want %q", raw, got, want)
		}
	}
}
