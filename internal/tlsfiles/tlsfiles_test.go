package tlsfiles_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/testcert"
	"github.com/pgoutbox/outbox/internal/tlsfiles"
)

func TestConfig(t *testing.T) {
	ca := testcert.NewCA(t, "t")
	client := ca.Client(t, "client", "relay")
	other := ca.Client(t, "other", "relay")
	tc, err := tlsfiles.Files{CA: ca.CertFile, Cert: client.CertFile, Key: client.KeyFile}.Config(nil)
	if err != nil {
		t.Fatal(err)
	}
	if tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.MinVersion == 0 {
		t.Fatalf("Config = %+v, want the CA as roots, one client certificate, a minimum version", tc)
	}

	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(other.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		files tlsfiles.Files
		want  string
	}{
		{tlsfiles.Files{CA: filepath.Join(dir, "missing.pem")}, "ca_file " + filepath.Join(dir, "missing.pem") + ": no such file or directory"},
		{tlsfiles.Files{CA: notPEM, Prefix: "outbox_"}, "outbox_ca_file " + notPEM + ": no PEM certificate in it"},
		{tlsfiles.Files{Cert: client.CertFile}, "cert_file and key_file go together"},
		{tlsfiles.Files{Key: client.KeyFile}, "cert_file and key_file go together"},
		{tlsfiles.Files{Cert: client.CertFile, Key: filepath.Join(dir, "nokey")}, "key_file " + filepath.Join(dir, "nokey") + ": no such file"},
		{tlsfiles.Files{Cert: client.CertFile, Key: other.KeyFile}, "cert_file " + client.CertFile + " with key_file " + other.KeyFile + ": tls: private key does not match public key"},
	} {
		err := c.files.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v, want %q", c.files, err, c.want)
			continue
		}
		body := strings.Split(string(keyPEM), "\n")[1]
		if strings.Contains(err.Error(), body) {
			t.Errorf("Check(%+v) quotes the private key: %v", c.files, err)
		}
	}
}
