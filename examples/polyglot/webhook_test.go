package polyglot_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestNodeWebhookReceiver: the Go writer's events are posted by a relay's
// outboxwebhook publisher (structured mode, the default) to
// receiver-webhook.js, which verifies each with npm standardwebhooks,
// decodes it with the npm cloudevents HTTP binding and applies it through
// the SQL inbox once, in sequence order, with every attribute as documented.
// A request whose body was changed after signing is refused with 401 and
// never applied.
func TestNodeWebhookReceiver(t *testing.T) {
	t.Parallel()
	needNodeModules(t, "standardwebhooks", "cloudevents", "pg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	rolledBack := writeOrders(t, ctx, pool, schema)

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key) // never printed
	lines, wait := startNode(t, ctx, append(nodeEnv(schema), outboxwebhook.EnvSecret+"="+secret),
		"receiver-webhook.js", "billing", itoa(expected))
	var listening struct{ Listening int }
	if l, ok := <-lines; !ok || json.Unmarshal([]byte(l), &listening) != nil || listening.Listening == 0 {
		wait()
		t.Fatalf("receiver-webhook.js printed %q, want {\"listening\":PORT}", l)
	}
	endpoint := "http://127.0.0.1:" + strconv.Itoa(listening.Listening) + "/outbox"

	// A genuine signature over a body that was then changed: 401, not applied.
	id := uuid.NewString()
	body := []byte(`{"specversion":"1.0","id":"` + id + `","source":"` + source + `","type":"OrderPlaced","subject":"o-9",` +
		`"time":"2026-01-02T03:04:05Z","datacontenttype":"application/json","aggregatetype":"order",` +
		`"sequence":"00000000000000000001","schemaversion":"1","partitionkey":"o-9","data":{"total":1}}`)
	sig, err := outboxwebhook.Sign([]string{secret}, id, time.Now(), body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(bytes.Replace(body, []byte(`"total":1`), []byte(`"total":0`), 1)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/cloudevents+json; charset=utf-8")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a tampered request was answered %d, want 401", resp.StatusCode)
	}

	pub, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: endpoint, Secrets: []string{secret}, Source: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	runRelay(t, ctx, pool, schema, pub)

	var report nodeReport
	lastJSON(t, lines, wait, &report)
	checkReport(t, report)
	if report.Refused != 1 {
		t.Errorf("the receiver refused %d requests, want 1 (the tampered one)", report.Refused)
	}
	checkReceived(t, ctx, pool, schema, "billing", rolledBack, true, time.Microsecond)
}
