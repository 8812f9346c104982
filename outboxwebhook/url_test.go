package outboxwebhook_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/testcert"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestParseURL: outbox_ parameters set the Config and leave the URL; the
// endpoint's own query stays as written; what cannot be honoured is refused.
func TestParseURL(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "hook")
	client := ca.Client(t, "client", "relay")
	cfg, err := outboxwebhook.ParseURL("https://hooks.example.com:8443/in/outbox?key=a%2Fb&outbox_source=/shop&outbox_timeout=5s&x=1&outbox_concurrency=4&outbox_max_response_bytes=2048&outbox_ca_file=" + ca.CertFile + "&outbox_cert_file=" + client.CertFile + "&outbox_key_file=" + client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	want := outboxwebhook.Config{URL: "https://hooks.example.com:8443/in/outbox?key=a%2Fb&x=1", Source: "/shop", Timeout: 5 * time.Second,
		Concurrency: 4, MaxResponseBytes: 2048, CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}
	if fmt.Sprint(cfg) != fmt.Sprint(want) || cfg.URL != want.URL {
		t.Fatalf("ParseURL = %v (URL %s), want %v (URL %s)", cfg, cfg.URL, want, want.URL)
	}
	if cfg, err := outboxwebhook.ParseURL("http://127.0.0.1:8080/hook"); err != nil || cfg.URL != "http://127.0.0.1:8080/hook" || cfg.Timeout != 0 || cfg.Mode != "" {
		t.Fatalf("plain URL: %v, %v", cfg, err)
	}
	if cfg, err := outboxwebhook.ParseURL("http://127.0.0.1:8080/hook?outbox_mode=binary"); err != nil || cfg.Mode != outboxwebhook.Binary || cfg.URL != "http://127.0.0.1:8080/hook" {
		t.Fatalf("outbox_mode=binary: %v, %v", cfg, err)
	}
	for raw, wantErr := range map[string]string{
		"ftp://h/x":                                                   "scheme",
		"https://user:hunter2@h/x":                                    "credentials",
		"https://hunter2@h/x":                                         "credentials",
		"https:///x":                                                  "no host",
		"https://h/x#frag":                                            "fragment",
		"https://h/x?outbox_timeout=-1s":                              "not a positive duration",
		"https://h/x?outbox_concurrency=0":                            "not a positive number",
		"https://h/x?outbox_secret=whsec_abc":                         "unknown option",
		"https://h/x?outbox_mode=batch":                               "not a content mode",
		"https://h/x?outbox_max_response_bytes=z":                     "not a positive number",
		"https://h/x?key=hunter2&outbox_ca_file=/no":                  "outbox_ca_file /no: no such file or directory",
		"https://h/x?key=hunter2&outbox_cert_file=" + client.CertFile: "outbox_cert_file and outbox_key_file go together",
		"https://h/x?key=hunter2&outbox_cert_file=" + client.CertFile + "&outbox_key_file=" + ca.CertFile: "outbox_key_file",
	} {
		_, err := outboxwebhook.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: %v, want an error about %s", raw, err, wantErr)
		}
		if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "whsec_abc")) {
			t.Errorf("%s: the error repeats a secret: %v", raw, err)
		}
	}
}

// TestSecretsNeverPrinted: a malformed secret's error, the Config's and the
// Publisher's String, and publish errors never contain a secret or the
// endpoint's query token.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	bad := "whsec_not*base64*hunter2"
	for _, secrets := range [][]string{{bad}, {secret, bad}, {"whsec_aHVudGVyMg=="}} {
		_, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: "https://h/x", Secrets: secrets})
		if err == nil {
			t.Fatalf("secrets %d accepted", len(secrets))
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) || strings.Contains(err.Error(), strings.TrimPrefix(s, "whsec_")) {
				t.Fatalf("error repeats a secret: %v", err)
			}
		}
		if _, err := outboxwebhook.NewReceiver(secrets, nil, outboxwebhook.ReceiverOptions{}); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("receiver: %v", err)
		}
	}
	// The path is secret too: Slack and Discord put the token there.
	cfg := outboxwebhook.Config{URL: "http://127.0.0.1:1/services/T0/B0/pathS3cret?token=t0ps3cret", Secrets: []string{secret}}
	p := publisher(t, cfg)
	err := publishOne(t, p, message("o-1", 1))
	answered := httpServer(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusInternalServerError) })
	pa := publisher(t, outboxwebhook.Config{URL: answered.URL + "/api/webhooks/1/pathS3cret", Secrets: []string{secret}})
	statusErr := publishOne(t, pa, message("o-1", 1))
	_, parseErr := outboxwebhook.ParseURL("https://h/api/webhooks/1/pathS3cret?outbox_timeout=-1s")
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), p.String(), fmt.Sprint(err), fmt.Sprint(statusErr), pa.String(), fmt.Sprint(parseErr)} {
		if strings.Contains(s, strings.TrimPrefix(secret, "whsec_")) || strings.Contains(s, "t0ps3cret") || strings.Contains(s, "S3cret") {
			t.Errorf("printed a secret: %s", s)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "http://127.0.0.1:1/xxxxx") {
		t.Fatalf("publish error %v does not name the endpoint", err)
	}
	if statusErr == nil || !strings.Contains(statusErr.Error(), answered.URL+"/xxxxx") {
		t.Fatalf("publish error %v does not name the endpoint", statusErr)
	}
}
