package redact_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/redact"
)

func TestDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:s3cret@db:5432/shop?sslmode=verify-full&sslrootcert=/ca.pem":   "postgres://app:xxxxx@db:5432/shop?sslmode=verify-full&sslrootcert=/ca.pem",
		"postgresql://app@db/shop?sslkey=/k.pem&sslpassword=s3cret&application_name=x": "postgresql://app@db/shop?sslkey=/k.pem&sslpassword=xxxxx&application_name=x",
		"postgres://app@db/shop?password=s3cret":                                       "postgres://app@db/shop?password=xxxxx",
		"postgres://app:p%40ss%2Fw0rd@db/shop":                                         "postgres://app:xxxxx@db/shop",
		"host=db user=app password=s3cret dbname=shop":                                 "host=db user=app password=xxxxx dbname=shop",
		"host=db password = 's3 cr\\'et' sslpassword=k3y sslmode=verify-full":          "host=db password = xxxxx sslpassword=xxxxx sslmode=verify-full",
		"host=db user=app":                    "host=db user=app",
		"postgres://app:s3cret@db:5432/shop%": "postgres://(unparsable URL, not shown)",
		"POSTGRES://app:s3cret@db/shop":       "postgres://app:xxxxx@db/shop",
		"PostgreSQL://app:s3cret@db/shop":     "postgresql://app:xxxxx@db/shop",
		"  postgres://app:s3cret@db/shop":     "postgres://app:xxxxx@db/shop",
		"postgres:/app:s3cret@db/shop":        "postgres://(unparsable URL, not shown)",
		"postgres:app:s3cret@db/shop":         "postgres://(unparsable URL, not shown)",
		"postgres://app:p@s3cret@db/shop":     "postgres://xxxxx@db/shop",
		"postgres://app:p@ss@s3cret@db/shop":  "postgres://xxxxx@db/shop",
		"app:s3cret@db/shop":                  "(malformed connection string, not shown)",
		"host=db app:s3cret@db":               "(malformed connection string, not shown)",
	} {
		got := redact.Database(in)
		if got != want {
			t.Errorf("Database(%q)\n = %q\nwant %q", in, got, want)
		}
		if strings.Contains(got, "s3") {
			t.Errorf("Database(%q) shows the secret", in)
		}
	}
}

// TestDatabaseSecretsMatchPgx checks that DatabaseSecrets finds the
// password and sslpassword pgx itself reads from a connection string, so
// that Secrets can take them out of any text.
func TestDatabaseSecretsMatchPgx(t *testing.T) {
	for _, s := range []string{
		"postgres://app:p%40ss%2Fw0rd@db/shop?sslpassword=k%20ey&sslmode=disable",
		"host=db password='s3 cr\\'et\\\\' sslpassword=k\\ ey sslmode=disable",
		"host=db password=plain sslmode=disable",
	} {
		cfg, err := pgconn.ParseConfig(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		got := redact.DatabaseSecrets(s)
		if len(got) == 0 || got[0] != cfg.Password {
			t.Errorf("DatabaseSecrets(%q) = %q, want the password %q first", s, got, cfg.Password)
		}
		if !strings.Contains(redact.Secrets("pw="+cfg.Password+".", got...), redact.Mask) ||
			strings.Contains(redact.Secrets("pw="+cfg.Password+".", got...), cfg.Password) {
			t.Errorf("Secrets does not hide %q", cfg.Password)
		}
	}
}

// TestDatabaseSecretsUnencodedAt: for a password with an unencoded '@',
// DatabaseSecrets also returns what pgx takes for the host (the tail after
// the first '@'), so that Secrets hides it in pgx's errors.
func TestDatabaseSecretsUnencodedAt(t *testing.T) {
	s := "postgres://app:pw@S3CRETtail@127.0.0.1:5432/shop?sslmode=disable"
	cfg, err := pgconn.ParseConfig(s)
	if err != nil {
		t.Fatal(err)
	}
	msg := "connect to database " + cfg.Host + ":5432 (password " + cfg.Password + ")"
	if got := redact.Secrets(msg, redact.DatabaseSecrets(s)...); strings.Contains(got, "S3CRET") {
		t.Fatalf("Secrets(%q) = %q: the tail of the password shows", msg, got)
	}
}

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"amqps://relay:s3cret@mq:5671/shop?exchange=outbox": "amqps://relay:xxxxx@mq:5671/shop?exchange=outbox",
		"https://hooks.example.com/in?token=s3cret&x=1":     "https://hooks.example.com/xxxxx",
		"https://hooks.example.com/in?Api_Key=s3cret":       "https://hooks.example.com/xxxxx",
		"https://hooks.slack.com/services/T0/B0/s3cret":     "https://hooks.slack.com/xxxxx",
		"https://discord.com/api/webhooks/1/s3cret":         "https://discord.com/xxxxx",
		"HTTPS://u:s3cret@h:8443/":                          "https://h:8443",
		" https://h/s3cret ":                                "https://h/xxxxx",
		"https://h":                                         "https://h",
		"kafka://relay@k:9092?sasl=plain&ca_file=/ca.pem":   "kafka://relay@k:9092?sasl=plain&ca_file=/ca.pem",
		"nats://relay:s3cret@n:4222?stream=S":               "nats://relay:xxxxx@n:4222?stream=S",
		"tls://s3cret@n:4222":                               "tls://xxxxx@n:4222",
		"http://h/p?%zz=s3cret":                             "http://h/xxxxx",
		"nats://u1:s3cret@h1:4222,u2:s3cret2@h2:4222":       "nats://u1:xxxxx@h1:4222,u2:xxxxx@h2:4222",
		"nats://tok1s3cret@h1,tok2s3cret@h2?stream=S":       "nats://xxxxx@h1,xxxxx@h2?stream=S",
		"nats://h1,tok-s3cret@h2":                           "nats://h1,xxxxx@h2",
		"nats://toks3cret@h1:4222, nats://tok2s3cret@h2":    "nats://xxxxx@h1:4222,nats://xxxxx@h2",
		"NATS://toks3cret@h":                                "nats://xxxxx@h",
		" tls://u:s3cret@h?token=s3cret":                    "tls://u:xxxxx@h?token=xxxxx",
		"amqp://relay:p@s3cret@mq:5672/":                    "amqp://xxxxx@mq:5672/",
		"AMQP://relay:s3cret@mq/":                           "amqp://relay:xxxxx@mq/",
		"amqp:relay:s3cret@mq":                              "amqp://(unparsable URL, not shown)",
		"amqp://relay:s3cret@mq:5672/%zz":                   "amqp://(unparsable URL, not shown)",
		"not a url with s3cret in it: ::":                   "(unparsable URL, not shown)",
		"nats":                                              "nats",
		" webhook ":                                         "webhook",
		"s3cret@h":                                          "(unparsable URL, not shown)",
	} {
		got := redact.URL(in)
		if got != want {
			t.Errorf("URL(%q)\n = %q\nwant %q", in, got, want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("URL(%q) shows the secret", in)
		}
	}
}

func TestSecrets(t *testing.T) {
	got := redact.Secrets("auth failed for p@ss/w0rd (p%40ss%2Fw0rd), key abc", "p@ss/w0rd", "abc", "")
	if want := "auth failed for xxxxx (xxxxx), key abc"; got != want {
		t.Errorf("Secrets = %q, want %q", got, want)
	}
}

// TestText: a webhook URL in free text (an old last_error) loses its path
// and query.
func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"post event 1 to https://hooks.slack.com/services/T0/B0/s3cret: 500 Internal": "post event 1 to https://hooks.slack.com/xxxxx: 500 Internal",
		"redirect to HTTP://h/x?token=s3cret not followed":                            "redirect to http://h/xxxxx not followed",
		"no url here": "no url here",
	} {
		if got := redact.Text(in); got != want {
			t.Errorf("Text(%q)\n = %q\nwant %q", in, got, want)
		}
	}
}
