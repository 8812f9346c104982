package outboxkafka_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestParseURL: the destination URL names the seed brokers and the Config
// fields; anything it cannot honour is refused without repeating a
// password.
func TestParseURL(t *testing.T) {
	t.Parallel()
	cfg, err := outboxkafka.ParseURL("kafka://k1:9093,k2,[::1]:9094,[::2]?topic=shop.{aggregate_type}&source=/shop&delivery_timeout=3s&dial_timeout=1s&max_record_bytes=2048")
	if err != nil {
		t.Fatal(err)
	}
	want := outboxkafka.Config{Brokers: []string{"k1:9093", "k2:9092", "[::1]:9094", "[::2]:9092"}, Topic: "shop.{aggregate_type}", Source: "/shop",
		DeliveryTimeout: 3 * time.Second, DialTimeout: time.Second, MaxRecordBytes: 2048}
	if !slices.Equal(cfg.Brokers, want.Brokers) || cfg.Topic != want.Topic || cfg.Source != want.Source ||
		cfg.DeliveryTimeout != want.DeliveryTimeout || cfg.DialTimeout != want.DialTimeout || cfg.MaxRecordBytes != want.MaxRecordBytes {
		t.Fatalf("ParseURL = %+v, want %+v", cfg, want)
	}
	if cfg, err := outboxkafka.ParseURL("kafka://127.0.0.1:9092"); err != nil || len(cfg.Brokers) != 1 || cfg.Topic != "" {
		t.Fatalf("plain URL: %+v, %v", cfg, err)
	}
	for _, raw := range []string{
		"nats://127.0.0.1:4222",
		"kafka://user:s3cret@k1:9092",
		"kafka://k1:9092/orders",
		"kafka://k1:9092,,k2",
		"kafka://k1:9092?acks=1",
		"kafka://k1:9092?topic=bad%20topic",
		"kafka://k1:9092?delivery_timeout=-1s",
		"kafka://k1:9092?max_record_bytes=0",
		"kafka://k1:99999",
		"kafka://k1:9092#x",
		"kafka://user:s3cret@k1:9092,k2",
		"kafka://",
	} {
		_, err := outboxkafka.ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) succeeded, want an error", raw)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v repeats the password", raw, err)
		}
	}
}
