package redact

import (
	"strings"
	"testing"
)

// Security review of issue 19, item 11: a URL that is not PostgreSQL's
// given where a database URL goes (a destination in the wrong flag or
// variable) is redacted as a URL. Read as key=value, a query's "x=1" made
// the whole URL one pair, shown as it was, password and webhook path
// included.
func TestDatabaseGivenAnotherURL(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"https://u:s3cret@hooks.slack.com/services/T0/B0/s3cret?x=1",
		" HTTPS://hooks.slack.com/services/T0/B0/s3cret?x=1",
		"nats://tok-s3cret@h1,u:s3cret@h2?stream=x",
		"kafka://u:s3cret@b1:9092?sasl=plain",
		"amqp://g:s3c@ret@h/?declare=false",
		"AMQPS://g:s3cret@h/?declare=false",
		"ftp://u:s3cret@h/?x=1",
	} {
		if got := Database(s); strings.Contains(got, "s3") {
			t.Errorf("Database(%q) = %q", s, got)
		}
	}
}

// Neither is anything else that starts with a scheme.
func TestDatabaseGivenSchemeWithoutAuthority(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"ftp:u:s3cret@h?x=1", "app:s3cret@db/shop?sslmode=disable"} {
		if got := Database(s); strings.Contains(got, "s3") {
			t.Errorf("Database(%q) = %q", s, got)
		}
	}
}
