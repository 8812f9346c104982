package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsageHidesSecretDefaults: a command that registers --database-url
// and --destination itself, with defaults from an environment that holds
// passwords, still prints them redacted in its usage; DatabaseURLFlag's
// default is redacted as registered.
func TestUsageHidesSecretDefaults(t *testing.T) {
	t.Setenv("DATABASE_URL", "host=db user=app password='pw S3CRET' sslpassword=k3y-S3CRET")
	t.Setenv("OUTBOX_DESTINATION", "tls://S3CRET-token@nats:4222")
	fs := NewFlagSet("orders", "x", "x [flags]")
	var out bytes.Buffer
	fs.SetOutput(&out)
	var db, own, dest string
	DatabaseURLFlag(fs, &db)
	fs.StringVar(&own, "destination", Env("OUTBOX_DESTINATION", ""), "where")
	if db != Env("DATABASE_URL", "") {
		t.Fatalf("the flag's value %q is not DATABASE_URL's", db)
	}
	fs.Usage()
	if s := out.String(); strings.Contains(s, "S3CRET") || !strings.Contains(s, "password=xxxxx") || !strings.Contains(s, "tls://xxxxx@nats:4222") {
		t.Errorf("usage shows a secret, or not the redacted defaults:\n%s", s)
	}
	fs2 := NewFlagSet("orders", "y", "y [flags]")
	fs2.StringVar(&dest, "database-url", Env("DATABASE_URL", ""), "db")
	fs2.SetOutput(&out)
	out.Reset()
	fs2.Usage()
	if strings.Contains(out.String(), "S3CRET") {
		t.Errorf("usage of a self-registered --database-url shows a secret:\n%s", out.String())
	}
}
