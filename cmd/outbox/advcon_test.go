package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdvconFleetConsoleHidesPasswords: databases whose URLs (written in
// every way the file allows: URL, keyword/value, a bad escape, an '@' in
// the password, a bad parameter) cannot be listed show as down on the
// index and on their pages without their passwords; nor do the console's
// logs hold them.
func TestAdvconFleetConsoleHidesPasswords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "ac")
	migrateFleetSchema(t, admin, schema)
	secrets := map[string]string{
		"refused":  "postgres://outbox:PwRefused71@127.0.0.1:1/x?sslmode=disable&connect_timeout=2",
		"badesc":   "postgres://outbox:PwBad%zzEsc72@127.0.0.1:1/x?sslmode=disable",
		"keyword":  "host=127.0.0.1 port=1 user=outbox password=PwKeyword73 dbname=x sslmode=disable connect_timeout=2",
		"kwbad":    "host=127.0.0.1 port=notaport user=outbox password=PwKwBad74 dbname=x",
		"at":       "postgres://outbox:PwAt@Sign75@127.0.0.1:1/x?sslmode=disable&connect_timeout=2",
		"badparam": "postgres://outbox:PwBadParam76@127.0.0.1:1/x?sslmode=bogus",
		"quoted":   "host=127.0.0.1 port=1 user=outbox password='Pw Quoted 77' dbname=x sslmode=disable connect_timeout=2",
	}
	pws := []string{"PwRefused71", "PwBad%zzEsc72", "PwBad", "PwKeyword73", "PwKwBad74", "PwAt@Sign75", "Sign75", "PwAt", "PwBadParam76", "Pw Quoted 77", "Quoted 77"}
	var dbs, srcs strings.Builder
	fmt.Fprintf(&dbs, "  main: {url: %q}\n", outboxtest.DatabaseURL())
	fmt.Fprintf(&srcs, "  - {database: main, schema: %s, destination: events}\n", schema)
	for name, u := range secrets {
		fmt.Fprintf(&dbs, "  %s: {url: %q}\n", name, u)
		fmt.Fprintf(&srcs, "  - {database: %s, schema: outbox, destination: events}\n", name)
	}
	const token = "tok-advcon-console-8e1f02aa"
	file := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(file, []byte("databases:\n"+dbs.String()+"destinations:\n  events: {url: \"nats://127.0.0.1:4222\"}\nsources:\n"+srcs.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startConsole(t, ctx, []string{"OUTBOX_CONSOLE_TOKEN=" + token}, "--config", file, "--listen", "127.0.0.1:0")
	c := noRedirects()
	check := func(what, text string) {
		t.Helper()
		for _, pw := range pws {
			if strings.Contains(text, pw) {
				t.Errorf("%s holds the password %q:\n%s", what, pw, text)
			}
		}
	}
	// A wrong login first: the throttle's and the refusal's log lines.
	form := url.Values{"name": {"eve"}, "token": {"wrong-token-000000000000"}}
	req, _ := http.NewRequest(http.MethodPost, p.base+"login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(p.base, "/"))
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
	}
	form.Set("token", token)
	req, _ = http.NewRequest(http.MethodPost, p.base+"login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(p.base, "/"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	code, _, body := consoleGet(t, c, p.base, "")
	if code != http.StatusOK {
		t.Fatalf("index: %d\n%s", code, body)
	}
	check("the index", body)
	for name := range secrets {
		if !strings.Contains(body, `data-source="`+name+`/`) {
			t.Errorf("the index has no row for %s", name)
		}
		for _, path := range []string{"sources/" + name + "/outbox/", "sources/" + name + "/outbox/quarantine", "sources/" + name + "/nope/"} {
			code, _, body := consoleGet(t, c, p.base+path, "")
			if code == http.StatusOK {
				t.Errorf("GET %s: 200", path)
			}
			check("GET "+path, body)
		}
	}
	check("the console's log", p.log())
}

// TestAdvconFleetConsolePatternRunsTenantCode: a role that may only create
// schemas in the database (a tenant) migrates a schema that the file's
// schema_pattern matches and replaces its outbox_relays by a view over its
// own function; an operator loading the console's index runs that
// function with the console's database role.
func TestAdvconFleetConsolePatternRunsTenantCode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "acp")
	role, schema := prefix+"_role", prefix+"_t_evil"
	var dbName string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE ROLE " + role + " LOGIN NOSUPERUSER", "GRANT CREATE ON DATABASE " + dbName + " TO " + role} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{"DROP SCHEMA IF EXISTS " + schema + " CASCADE", "DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := admin.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	tenant, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer tenant.Close()
	// The tenant copies the outbox's tables from a schema the operator
	// migrated (migrate needs more than it has): only a table named
	// outbox_events makes a schema a source.
	template := prefix + "_tpl"
	migrateFleetSchema(t, admin, template)
	for _, q := range []string{"GRANT USAGE ON SCHEMA " + template + " TO " + role, "GRANT SELECT ON ALL TABLES IN SCHEMA " + template + " TO " + role} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		"CREATE SCHEMA " + schema,
		"CREATE TABLE " + schema + ".outbox_events (LIKE " + template + ".outbox_events INCLUDING ALL)",
		`CREATE FUNCTION ` + schema + `.relays() RETURNS TABLE(relay_id text, heartbeat_at timestamptz, expires_at timestamptz) LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'tenant code ran as % (superuser %)', current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
END $$`,

		`CREATE VIEW ` + schema + `.outbox_relays AS SELECT * FROM ` + schema + `.relays()`,
	} {
		if _, err := tenant.Exec(ctx, q); err != nil {
			t.Fatalf("as the tenant: %v", err)
		}
	}
	const token = "tok-advcon-pattern-3c9e11f0"
	file := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(file, fmt.Appendf(nil, `databases:
  main: {url: %q}
destinations:
  events: {url: "nats://127.0.0.1:4222"}
sources:
  - {database: main, schema_pattern: "%s_t_*", destination: events}
`, outboxtest.DatabaseURL(), prefix), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startConsole(t, ctx, []string{"OUTBOX_CONSOLE_TOKEN=" + token}, "--config", file, "--listen", "127.0.0.1:0")
	c := noRedirects()
	form := url.Values{"name": {"alice"}, "token": {token}}
	req, _ := http.NewRequest(http.MethodPost, p.base+"login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(p.base, "/"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, _, body := consoleGet(t, c, p.base, "")
	if m := regexp.MustCompile(`tenant code ran as [^<]*`).FindString(body); m != "" && !strings.Contains(m, role) {
		t.Errorf("loading the index ran the tenant's function as another role than the tenant's: %q", m)
	}
}
