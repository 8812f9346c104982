package outboxamqp_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestParseURL: the destination URL names the broker and the Config fields;
// anything it cannot honour is refused without repeating a password.
func TestParseURL(t *testing.T) {
	cfg, err := outboxamqp.ParseURL("amqps://relay:s3cret@mq.example:5671/shop?exchange=events&routing_key=shop.{aggregate_type}.{aggregate_id}&source=/shop&confirm_timeout=3s&dial_timeout=1s&max_message_bytes=2048&declare=false&check_queues=orders,%20audit")
	if err != nil {
		t.Fatal(err)
	}
	want := outboxamqp.Config{URL: "amqps://relay:s3cret@mq.example:5671/shop", Exchange: "events", NoDeclare: true,
		RoutingKey: "shop.{aggregate_type}.{aggregate_id}", Source: "/shop", ConfirmTimeout: 3 * time.Second, DialTimeout: time.Second, MaxMessageBytes: 2048,
		CheckQueues: []string{"orders", "audit"}}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("ParseURL = %s, want %s", cfg, want)
	}
	if cfg, err := outboxamqp.ParseURL("amqp://127.0.0.1"); err != nil || cfg.URL != "amqp://127.0.0.1" || cfg.Exchange != "" || cfg.NoDeclare {
		t.Fatalf("plain URL: %s, %v", cfg, err)
	}
	for _, raw := range []string{
		"nats://127.0.0.1:4222",
		"amqp://user:s3cret@mq:5672/?acks=1",
		"amqp://user:s3cret@mq:99999/",
		"amqp://user:s3cret@mq:x/",
		"amqp://user:s3cret@mq:5672/?confirm_timeout=-1s",
		"amqp://user:s3cret@mq:5672/?max_message_bytes=0",
		"amqp://user:s3cret@mq:5672/?declare=maybe",
		"amqp://user:s3cret@mq:5672/?check_queues=a,,b",
		"amqp://user:s3cret@mq:5672/?routing_key=" + strings.Repeat("k", 300),
		"amqp://user:s3cret@mq:5672/#x",
		"amqp://user:s3cret@/",
		"amqp://user:s3cret@mq:5672/%zz",
		"amqp:// user:s3cret@mq",
	} {
		_, err := outboxamqp.ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) succeeded, want an error", raw)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v repeats the password", raw, err)
		}
	}
}

// TestParseURLPasswordFromEnv: a URL that names a user without a password
// takes it from OUTBOX_AMQP_PASSWORD; a password in the URL wins.
func TestParseURLPasswordFromEnv(t *testing.T) {
	t.Setenv(outboxamqp.PasswordEnv, "fr0m-env")
	cfg, err := outboxamqp.ParseURL("amqp://relay@mq:5672/shop")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.URL != "amqp://relay:fr0m-env@mq:5672/shop" {
		t.Fatalf("URL %q: want the password from the environment", cfg.URL)
	}
	if strings.Contains(cfg.String(), "fr0m-env") {
		t.Fatalf("String() = %s repeats the password", cfg)
	}
	cfg, err = outboxamqp.ParseURL("amqp://relay:in-url@mq:5672/shop")
	if err != nil || cfg.URL != "amqp://relay:in-url@mq:5672/shop" {
		t.Fatalf("URL %q, %v: want the URL's own password", cfg.URL, err)
	}
	cfg, err = outboxamqp.ParseURL("amqp://mq:5672/")
	if err != nil || cfg.URL != "amqp://mq:5672/" {
		t.Fatalf("URL %q, %v: no user, no password", cfg.URL, err)
	}
}
