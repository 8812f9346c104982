package redact

import (
	"strings"
	"testing"
)

// TestPasswordWithUnencodedDelimiterHidden: a password holding an
// unencoded '/', '?' or '#' (common in generated passwords) ends the
// authority early. When what precedes it reads as host:port (the user name
// as host, the password's start as a port: digits or nothing), the URL
// parses and the rest of the password is shown as the path, query or
// fragment. The redacted text must never contain the password's tail.
func TestPasswordWithUnencodedDelimiterHidden(t *testing.T) {
	for _, c := range []struct{ raw, secret string }{
		{"postgres://app:/s3cretTail@db.example.com/orders", "s3cretTail"},
		{"postgres://app:2024/s3cretTail@db.example.com/orders", "s3cretTail"},
		{"amqp://app:#s3cretTail@mq.example.com/vhost", "s3cretTail"},
		{"amqp://app:99?s3cretTail@mq.example.com/vhost", "s3cretTail"},
		{"kafka://app:/s3cretTail@broker:9092", "s3cretTail"},
	} {
		for name, got := range map[string]string{"URL": URL(c.raw), "Database": Database(c.raw)} {
			if strings.Contains(got, c.secret) {
				t.Errorf("%s(%q) = %q: shows the password's tail %q", name, c.raw, got, c.secret)
			}
		}
	}
}

// TestQueryRedactedWhenUserPartAmbiguous: with an unencoded '@' in
// the password (more than one '@'), genericURL hides the user part whole
// and returns early, before the query's secret parameters are masked.
func TestQueryRedactedWhenUserPartAmbiguous(t *testing.T) {
	raw := "postgres://app:p@ss@db.example.com/orders?sslpassword=KeyPass123&sslmode=verify-full"
	for name, got := range map[string]string{"URL": URL(raw), "Database": Database(raw)} {
		if strings.Contains(got, "KeyPass123") {
			t.Errorf("%s(%q) = %q: shows sslpassword", name, raw, got)
		}
	}
}
