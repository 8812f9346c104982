package outboxnats_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/outboxnats"
)

func TestParseURL(t *testing.T) {
	server, cfg, err := outboxnats.ParseURL("nats://127.0.0.1:4222?stream=ORDERS&subject_prefix=shop.outbox&source=/shop&duplicate_window=5m&ack_timeout=3s&max_pending=64")
	if err != nil {
		t.Fatal(err)
	}
	want := outboxnats.Config{Stream: "ORDERS", SubjectPrefix: "shop.outbox", Source: "/shop", DuplicateWindow: 5 * time.Minute, AckTimeout: 3 * time.Second, MaxPending: 64}
	if server != "nats://127.0.0.1:4222" || cfg != want {
		t.Fatalf("ParseURL = %q, %+v; want nats://127.0.0.1:4222, %+v", server, cfg, want)
	}
	server, cfg, err = outboxnats.ParseURL("tls://alice:s3cret@h1:4222,h2:4222")
	if err != nil || server != "tls://alice:s3cret@h1:4222,h2:4222" || cfg != (outboxnats.Config{}) {
		t.Fatalf("ParseURL without query = %q, %+v, %v", server, cfg, err)
	}
}

func TestParseURLRefusesAndRedacts(t *testing.T) {
	for _, raw := range []string{
		"kafka://h:1",
		"nats://alice:s3cret@h:4222?stream=a.b",
		"nats://alice:s3cret@h:4222?subject_prefix=a.>",
		"nats://alice:s3cret@h:4222?duplicate_window=-1s",
		"nats://alice:s3cret@h:4222?max_pending=0",
		"nats://alice:s3cret@h:4222?topic=x",
		"nats://alice:s3cret@h:4222/path",
		"nats://alice:s3cret@",
	} {
		_, _, err := outboxnats.ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) accepted it", raw)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q) error shows the password: %v", raw, err)
		}
	}
	for raw, want := range map[string]string{
		"nats://alice:s3cret@h:4222": "nats://alice:xxxxx@h:4222",
		"nats://tok3n@h:4222":        "nats://xxxxx@h:4222",
		"nats://h:4222":              "nats://h:4222",
	} {
		if got := outboxnats.Redact(raw); got != want {
			t.Errorf("Redact(%q) = %q, want %q", raw, got, want)
		}
	}
}
