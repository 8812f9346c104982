package outboxamqp_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/internal/testcert"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestParseURLTLSFiles: ca_file, cert_file and key_file set the Config's
// TLS files, are read at once (a bad one is an error naming the option),
// and need amqps://; no error repeats the password.
func TestParseURLTLSFiles(t *testing.T) {
	ca := testcert.NewCA(t, "mq")
	client := ca.Client(t, "client", "relay")
	files := "ca_file=" + ca.CertFile + "&cert_file=" + client.CertFile + "&key_file=" + client.KeyFile
	cfg, err := outboxamqp.ParseURL("amqps://relay:s3cret@mq:5671/?" + files)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CAFile != ca.CertFile || cfg.CertFile != client.CertFile || cfg.KeyFile != client.KeyFile || cfg.URL != "amqps://relay:s3cret@mq:5671/" {
		t.Fatalf("ParseURL = %s", cfg)
	}
	for raw, want := range map[string]string{
		"amqp://relay:s3cret@mq/?" + files:                                                  "needs amqps://",
		"amqps://relay:s3cret@mq/?ca_file=/no":                                              "ca_file /no: no such file or directory",
		"amqps://relay:s3cret@mq/?cert_file=" + client.CertFile:                             "cert_file and key_file go together",
		"amqps://relay:s3cret@mq/?ca_file=" + client.KeyFile:                                "no PEM certificate",
		"amqps://relay:s3cret@mq/?cert_file=" + ca.CertFile + "&key_file=" + client.KeyFile: "private key does not match",
	} {
		_, err := outboxamqp.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", raw, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v repeats the password", raw, err)
		}
	}
}

// TestTLSClientCertificate publishes through amqps:// to the machine's
// RabbitMQ behind a TLS proxy that requires a client certificate: with the
// CA and the certificate the broker confirms the message; without the
// certificate, or trusting another CA, the handshake fails and the broker
// is unavailable (no attempt spent), with an error that says why.
func TestTLSClientCertificate(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "mq")
	client := ca.Client(t, "client", "relay")
	plain, err := url.Parse(rabbittest.URL())
	if err != nil {
		t.Fatal(err)
	}
	addr := testcert.Proxy(t, ca.ServerConfig(t, ca.Server(t, "server")), plain.Host)
	secure := *plain
	secure.Scheme, secure.Host = "amqps", addr

	_, b := setup(t, rabbittest.URL(), outboxamqp.Config{}, "outbox.#")
	p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: secure.String(), Exchange: b.exchange,
		CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	checkNil(t, p.Publish(testCtx(t), []outbox.Message{event("o-tls", 1)}))
	if got := b.read(t, 1); got[0].MessageId == "" {
		t.Fatalf("the message read back has no id: %+v", got[0])
	}

	other := testcert.NewCA(t, "other")
	for name, c := range map[string]struct {
		cfg  outboxamqp.Config
		want []string // one of
	}{
		// With TLS 1.3 the server refuses a missing client certificate
		// after the client has finished its side of the handshake: the
		// client reads the server's alert ("certificate required") or, when
		// the server has closed first, a closed connection (seen once in
		// CI). Either way the broker is unavailable.
		"no client certificate": {outboxamqp.Config{CAFile: ca.CertFile}, []string{"certificate required", "connection is not open"}},
		"another CA":            {outboxamqp.Config{CAFile: other.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}, []string{"unknown authority"}},
	} {
		c.cfg.URL, c.cfg.Exchange = secure.String(), b.exchange
		p, err := outboxamqp.NewPublisher(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		err = p.Probe(testCtx(t))
		if !outbox.IsUnavailable(err) || !slices.ContainsFunc(c.want, func(w string) bool { return strings.Contains(err.Error(), w) }) {
			t.Errorf("%s: Probe = %v, want unavailable saying one of %q", name, err, c.want)
		}
		errs := p.Publish(testCtx(t), []outbox.Message{event("o-tls", 2)})
		if len(errs) != 1 || !outbox.IsUnavailable(errs[0]) {
			t.Errorf("%s: Publish = %v, want unavailable", name, errs)
		}
	}
}
