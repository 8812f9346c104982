package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
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
