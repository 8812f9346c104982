package outboxkafka_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/testcert"
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

// TestParseURLCredentials: a user in the URL is the SASL user, sasl= is
// required with it, and its password comes from the URL or, preferably,
// OUTBOX_KAFKA_PASSWORD; tls= and the PEM files set the TLS fields. No
// error repeats the password.
func TestParseURLCredentials(t *testing.T) {
	const pw = "Pw-s3cret-e81"
	t.Setenv(outboxkafka.PasswordEnv, pw)
	ca := testcert.NewCA(t, "kafka")
	client := ca.Client(t, "client", "relay")
	cfg, err := outboxkafka.ParseURL("kafka://relay@k1,k2:9093?sasl=scram-sha-512&tls=true&ca_file=" + ca.CertFile + "&cert_file=" + client.CertFile + "&key_file=" + client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "relay" || cfg.Password != pw || cfg.SASLMechanism != outboxkafka.SASLScramSHA512 || !cfg.TLS ||
		cfg.CAFile != ca.CertFile || cfg.CertFile != client.CertFile || cfg.KeyFile != client.KeyFile ||
		!slices.Equal(cfg.Brokers, []string{"k1:9092", "k2:9093"}) {
		t.Fatalf("ParseURL = %v", cfg)
	}
	// A password in the URL (percent-encoded) wins over the environment.
	cfg, err = outboxkafka.ParseURL("kafka://re%40lay:in%2Furl@k1?sasl=PLAIN")
	if err != nil || cfg.User != "re@lay" || cfg.Password != "in/url" || cfg.SASLMechanism != outboxkafka.SASLPlain || cfg.TLS {
		t.Fatalf("ParseURL with a password: %v, %v", cfg, err)
	}
	// A CA file alone implies TLS.
	if cfg, err := outboxkafka.ParseURL("kafka://k1?ca_file=" + ca.CertFile); err != nil || !cfg.TLS {
		t.Fatalf("ca_file alone: %v, %v", cfg, err)
	}
	if cfg, err := outboxkafka.ParseURL("kafka://relay@k1?sasl=scram-sha-256"); err != nil || cfg.SASLMechanism != outboxkafka.SASLScramSHA256 {
		t.Fatalf("scram-sha-256: %v, %v", cfg, err)
	}
	for raw, want := range map[string]string{
		"kafka://relay@k1":                                                                                 "sasl=plain, sasl=scram-sha-256 or sasl=scram-sha-512",
		"kafka://relay:" + pw + "@k1":                                                                      "sasl=plain, sasl=scram-sha-256 or sasl=scram-sha-512",
		"kafka://k1?sasl=plain":                                                                            "needs a user",
		"kafka://relay:" + pw + "@k1?sasl=gssapi":                                                          "known: plain, scram-sha-256, scram-sha-512",
		"kafka://relay:" + pw + "@k1?sasl=plain&tls=maybe":                                                 "tls: not true or false",
		"kafka://relay:" + pw + "@k1?tls=false&ca_file=/x":                                                 "tls=false",
		"kafka://relay:" + pw + "@k1?sasl=plain&cert_file=/x":                                              "cert_file and key_file go together",
		"kafka://relay:" + pw + "@k1?sasl=plain&ca_file=/no":                                               "ca_file /no: no such file or directory",
		"kafka://relay:" + pw + "@k1?sasl=plain&ca_file=" + client.KeyFile:                                 "no PEM certificate",
		"kafka://relay:" + pw + "@k1?sasl=plain&cert_file=" + client.CertFile + "&key_file=" + ca.CertFile: "key_file",
		"kafka://relay:" + pw + "%zz@k1?sasl=plain":                                                        "percent-encoding",
		"kafka://relay:" + pw + "@k1:99999?sasl=plain":                                                     "bad port",
		"kafka://relay:" + pw + "@k1?sasl=plain&bogus=1":                                                   "unknown parameter",
		"kafka://:" + pw + "@k1?sasl=plain":                                                                "bad user",
		"kafka://relay:pa/" + pw + "@k1?sasl=plain":                                                        "not shown",
		"kafka://relay:pa?" + pw + "@k1?sasl=plain":                                                        "not shown",
		"kafka://relay:pa#" + pw + "@k1?sasl=plain":                                                        "not shown",
	} {
		_, err := outboxkafka.ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) succeeded", raw)
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("ParseURL(%q): %v repeats the password", raw, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q): %v, want it to say %q", raw, err, want)
		}
	}
	t.Setenv(outboxkafka.PasswordEnv, "")
	if _, err := outboxkafka.ParseURL("kafka://relay@k1?sasl=plain"); err == nil || !strings.Contains(err.Error(), outboxkafka.PasswordEnv) {
		t.Fatalf("no password anywhere: %v, want it to name %s", err, outboxkafka.PasswordEnv)
	}
}
