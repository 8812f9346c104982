package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/secrettest"
)

// TestRelayLogsNeverShowDestinationSecrets starts `outbox relay` on each kind
// of destination URL, with a password (or an endpoint token) in it and
// nothing listening, and lets it log its retries: neither the password nor
// the webhook signing secret (from OUTBOX_WEBHOOK_SECRET) may appear in
// its output.
func TestRelayLogsNeverShowDestinationSecrets(t *testing.T) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	signing := "whsec_" + base64.StdEncoding.EncodeToString(key)
	t.Setenv("OUTBOX_WEBHOOK_SECRET", signing)
	_, schema := outboxtest.Schema(t)
	for name, url := range map[string]string{
		"nats":    "nats://relay:pw-n4ts-s3cret@127.0.0.1:%d",
		"kafka":   "kafka://relay:pw-k4fka-s3cret@127.0.0.1:%d?sasl=plain",
		"amqp":    "amqp://relay:pw-4mqp-s3cret@127.0.0.1:%d/",
		"webhook": "http://127.0.0.1:%d/hook?token=pw-h00k-s3cret",
	} {
		t.Run(name, func(t *testing.T) {
			relay := startRelayProcess(t, "--schema", schema, "--destination", fmt.Sprintf(url, freePort(t)),
				"--metrics-addr", "127.0.0.1:0")
			addr := relay.metricsAddr(t)
			relay.waitingFor(t, addr, "destination")
			relay.stop(t)
			out := relay.log()
			for _, secret := range []string{"s3cret", signing, signing[len("whsec_"):]} {
				if strings.Contains(out, secret) {
					t.Errorf("the relay's output shows a secret (%.12s…):\n%s", secret, out)
				}
			}
			if !strings.Contains(out, "127.0.0.1") {
				t.Errorf("the relay's output does not name the destination it waits for:\n%s", out)
			}
		})
	}
}

// TestRelayStartErrorsNeverShowHostileSecrets starts `outbox relay` on
// destination URLs whose password or token holds, unencoded, what a URL
// parser reads as a delimiter (? / # @ & = % : and unicode): each is
// refused at start, or accepted and waited for, and neither the relay's
// output nor /readyz shows a 4-byte run of the secret. Before, the NATS and
// AMQP parsers quoted a token or password holding '?' or '/' back as a
// server address, a port or a parameter name, and a monitor_url password
// as the parameter's value.
func TestRelayStartErrorsNeverShowHostileSecrets(t *testing.T) {
	// Parallel, and so are its 36 relays: each mostly waits for its
	// destination's retries. The secrets' variables are the relays'
	// environment (the last value of a key wins), not this process's, so
	// that no t.Setenv keeps the test serial.
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	env := append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL(), "OUTBOX_FAILPOINTS=",
		"OUTBOX_KAFKA_PASSWORD=", "OUTBOX_AMQP_PASSWORD=",
		"OUTBOX_WEBHOOK_SECRET=whsec_"+base64.StdEncoding.EncodeToString(make([]byte, 32)))
	// The secrets a parser is likeliest to split; every one of
	// secrettest.Hostile goes through each parser in its package's test.
	secrets := []string{"Qz?S3cr3tTail", "Qz/S3cr3tTail", "20247/S3cr3tTail", "99998?S3cr3t&Tail=1", "Qzü€S3cr3tTail", "Qz%zzS3cr3tTail"}
	templates := map[string]string{
		"nats-password": "nats://relay:%s@127.0.0.1:%d",
		"nats-token":    "nats://%s@127.0.0.1:%d",
		"nats-monitor":  "nats://127.0.0.1:%[2]d?monitor_url=http://admin:%[1]s@127.0.0.1:8222",
		"kafka":         "kafka://relay:%s@127.0.0.1:%d?sasl=plain",
		"amqp":          "amqp://relay:%s@127.0.0.1:%d/",
		"webhook":       "http://relay:%s@127.0.0.1:%d/hook",
	}
	for name, tmpl := range templates {
		for i, secret := range secrets {
			t.Run(fmt.Sprintf("%s/%d", name, i), func(t *testing.T) {
				t.Parallel()
				dest := fmt.Sprintf(tmpl, secret, freePort(t))
				relay := startRelayProcessEnv(t, env, "--schema", schema, "--destination", dest, "--metrics-addr", "127.0.0.1:0")
				addr := relay.metricsAddr(t)
				var exited bool
				var readyzBody string
				outboxtest.Eventually(t, 60*time.Second, "the relay refuses the destination or waits for it", func() bool {
					select {
					case err := <-relay.waitErr:
						relay.waitErr <- err
						exited = true
						return true
					default:
					}
					if strings.Count(relay.log(), `msg="waiting for the destination"`) >= 2 {
						_, readyzBody = readyz(t, addr)
						return true
					}
					return false
				})
				if !exited {
					relay.stop(t)
				} else if !strings.Contains(relay.log(), "destination") {
					t.Errorf("the relay exited without saying the destination is what it refused:\n%s", relay.log())
				}
				for what, text := range map[string]string{"output": relay.log(), "/readyz": readyzBody} {
					if run := secrettest.Leak(text, secret); run != "" {
						t.Errorf("the relay's %s shows %q of the secret:\n%s", what, run, text)
					}
				}
			})
		}
	}
}
