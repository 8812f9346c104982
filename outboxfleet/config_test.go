package outboxfleet_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/outboxfleet"
)

const validConfig = `
relay:
  poll_interval: 500ms
databases:
  main:
    url: postgres://fleet:s3cret-pw@db.internal:5432/app
    trusted_owners: [outbox_migrator, fleet]
destinations:
  events:
    url: nats://relay:n4ts-pw@nats.internal:4222?stream=EVENTS
  billing:
    url: https://hooks.internal/billing?token=w3bhook-tok
sources:
  - database: main
    schema: orders
    destination: events
  - database: main
    schema_pattern: "tenant_*"
    routes:
      - aggregate_types: [invoice, payment]
        destination: billing
      - destination: events
`

// TestConfigErrorsAreClear: each mistake is refused with one line that
// says where and what, and no error quotes a URL's secret.
func TestConfigErrorsAreClear(t *testing.T) {
	if _, err := outboxfleet.Parse([]byte(validConfig)); err != nil {
		t.Fatalf("valid configuration refused: %v", err)
	}
	replace := func(old, new string) string {
		if !strings.Contains(validConfig, old) {
			t.Fatalf("%q not in the valid configuration", old)
		}
		return strings.Replace(validConfig, old, new, 1)
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"empty", "", "empty configuration"},
		{"unknown key", replace("poll_interval: 500ms", "pol_interval: 500ms"), "field pol_interval not found"},
		{"bad duration", replace("poll_interval: 500ms", "poll_interval: soon"), "soon"},
		{"idle_max too long", replace("poll_interval: 500ms", "poll_interval: 500ms\n  idle_max: 21m"), "idle_max 21m0s and heartbeat_interval 0s must be at most 20m0s"},
		{"unknown database", replace("  - database: main\n    schema: orders", "  - database: mian\n    schema: orders"), `sources[0]: database "mian" is not in databases (main)`},
		{"unknown destination", replace("    destination: events\n  - database", "    destination: evnts\n  - database"), `sources[0]: destination "evnts" is not in destinations (billing, events)`},
		{"schema and pattern", replace("    schema: orders", "    schema: orders\n    schema_pattern: x*"), "sources[0]: set schema or schema_pattern, not both nor neither"},
		{"bad pattern", replace(`schema_pattern: "tenant_*"`, `schema_pattern: "tenant_["`), `sources[1]: schema_pattern "tenant_["`},
		{"database key with a slash", replace("  main:\n    url:", "  eu/west:\n    url:"), `databases: invalid name "eu/west"`},
		{"database key ..", replace("  main:\n    url:", "  \"..\":\n    url:"), `databases: invalid name ".."`},
		{"destination key with a space", replace("  billing:\n    url:", "  \"bill ing\":\n    url:"), `destinations: invalid name "bill ing"`},
		{"empty trusted owner", replace("trusted_owners: [outbox_migrator, fleet]", "trusted_owners: [\"\"]"), "databases.main.trusted_owners: an empty role name"},
		{"bad schema name", replace("schema: orders", "schema: my-orders"), `sources[0]: invalid schema name "my-orders"`},
		{"destination and routes", replace("    routes:", "    destination: events\n    routes:"), "sources[1]: set destination or routes"},
		{"type in two routes", replace("aggregate_types: [invoice, payment]", "aggregate_types: [invoice, payment]\n        destination: billing\n      - aggregate_types: [payment]"), `aggregate type "payment" is already routed by routes[0]: an aggregate type goes to one destination`},
		{"two fallbacks", replace("      - destination: events", "      - destination: events\n      - destination: billing"), "a second route without aggregate_types"},
		{"same schema twice", replace("    schema_pattern: \"tenant_*\"", "    schema: orders"), "schema orders of database main is already sources[0]"},
		{"destination unused", replace("  billing:\n", "  unused:\n    url: nats://x:4222\n  billing:\n"), "destinations.unused: no source routes to it"},
		{"no url", replace("    url: postgres://fleet:s3cret-pw@db.internal:5432/app", "    max_conns: 4"), "databases.main: url (or url_file) is required"},
		{"one connection", replace("    url: postgres://fleet:s3cret-pw@db.internal:5432/app", "    url: postgres://fleet:s3cret-pw@db.internal:5432/app\n    max_conns: 1"), "databases.main.max_conns 1: at least 2"},
		{"unset variable", replace("s3cret-pw", "${OUTBOX_FLEET_TEST_UNSET_PW}"), "databases.main: url refers to unset environment variable OUTBOX_FLEET_TEST_UNSET_PW"},
		{"missing url file", replace("    url: postgres://fleet:s3cret-pw@db.internal:5432/app", "    url_file: /nonexistent/db-url"), "databases.main: url_file: open /nonexistent/db-url"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := outboxfleet.Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("accepted; want an error with %q", c.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) {
				t.Fatalf("error %q: want it to say %q", msg, c.want)
			}
			if strings.Contains(msg, "\n") {
				t.Fatalf("error %q spans several lines", msg)
			}
			for _, secret := range []string{"s3cret-pw", "n4ts-pw", "w3bhook-tok"} {
				if strings.Contains(msg, secret) {
					t.Fatalf("error %q quotes a secret", msg)
				}
			}
		})
	}
}

// TestConfigSecretsFromEnvAndFiles: ${NAME} and url_file supply the
// secrets, and the configuration's description never shows them.
func TestConfigSecretsFromEnvAndFiles(t *testing.T) {
	t.Setenv("OUTBOX_FLEET_TEST_PW", "env-s3cret")
	file := filepath.Join(t.TempDir(), "nats-url")
	if err := os.WriteFile(file, []byte("nats://relay:file-s3cret@nats.internal:4222\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(validConfig, "s3cret-pw", "${OUTBOX_FLEET_TEST_PW}", 1)
	yaml = strings.Replace(yaml, "    url: nats://relay:n4ts-pw@nats.internal:4222?stream=EVENTS", "    url_file: "+file, 1)
	cfg, err := outboxfleet.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Databases["main"].URL; got != "postgres://fleet:env-s3cret@db.internal:5432/app" {
		t.Fatalf("database url %q: want the variable's value in it", got)
	}
	if got := cfg.Destinations["events"].URL; got != "nats://relay:file-s3cret@nats.internal:4222" {
		t.Fatalf("destination url %q: want the file's content", got)
	}
	desc := cfg.String()
	for _, secret := range []string{"env-s3cret", "file-s3cret", "w3bhook-tok"} {
		if strings.Contains(desc, secret) {
			t.Fatalf("the description shows a secret:\n%s", desc)
		}
	}
	for _, want := range []string{"db.internal", "trusted_owners outbox_migrator,fleet", "source main schemas tenant_*: invoice,payment -> billing; other types -> events"} {
		if !strings.Contains(desc, want) {
			t.Fatalf("the description lacks %q:\n%s", want, desc)
		}
	}
}
