package outboxnats_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/testcert"
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

// TestParseURLTLSFiles: ca_file, cert_file and key_file set the TLS files,
// are read at once (a bad one is an error naming the option and the file),
// and make ConnectOptions return TLS; no error repeats the password.
func TestParseURLTLSFiles(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "nats")
	client := ca.Client(t, "client", "relay")
	server, cfg, err := outboxnats.ParseURL("tls://relay:s3cret@h:4222?stream=S&ca_file=" + ca.CertFile + "&cert_file=" + client.CertFile + "&key_file=" + client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if server != "tls://relay:s3cret@h:4222" || cfg.Stream != "S" || cfg.CAFile != ca.CertFile || cfg.CertFile != client.CertFile || cfg.KeyFile != client.KeyFile {
		t.Fatalf("ParseURL = %s, %+v", server, cfg)
	}
	if opts, err := cfg.ConnectOptions(); err != nil || len(opts) != 1 {
		t.Fatalf("ConnectOptions = %d options, %v; want TLS", len(opts), err)
	}
	if opts, err := (outboxnats.Config{}).ConnectOptions(); err != nil || len(opts) != 0 {
		t.Fatalf("ConnectOptions without files = %d options, %v; want none", len(opts), err)
	}
	for raw, want := range map[string]string{
		"nats://relay:s3cret@h?ca_file=/no":                                   "ca_file /no: no such file or directory",
		"nats://relay:s3cret@h?key_file=" + client.KeyFile:                    "cert_file and key_file go together",
		"nats://relay:s3cret@h?ca_file=" + client.KeyFile:                     "no PEM certificate",
		"nats://relay:s3cret@h?cert_file=" + client.CertFile + "&key_file=/n": "key_file /n: no such file",
	} {
		_, _, err := outboxnats.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v repeats the password", raw, err)
		}
	}
}
