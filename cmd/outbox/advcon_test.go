package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdvconFleetConsoleHidesPasswords: databases whose URLs (written in
// every way the file allows: URL, keyword/value, a bad escape, an '@' in
// the password, a bad parameter) cannot be listed show as down on the
// index and on their pages without their passwords; nor do the console's
// logs hold them, nor its headers.
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
