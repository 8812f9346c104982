package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// migrateFleetSchema migrates schema in pool's database and drops it when
// the test ends.
func migrateFleetSchema(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	if _, err := outboxmigrate.Migrate(context.Background(), pool, schema); err != nil {
		t.Fatalf("migrate %s: %v", schema, err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
}

func writeEvents(t *testing.T, pool *pgxpool.Pool, schema string, evs ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, evs...); return err }); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// operations lists the audit log of a schema as "action actor".
func operations(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT action || ' ' || actor FROM "+schema+".outbox_operations ORDER BY operation_id")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

var (
	csrfValue = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)
	indexRow  = regexp.MustCompile(`(?s)<tr class="source( down)?" data-source="([^"]*)">(.*?)</tr>`)
	figure    = regexp.MustCompile(`data-figure="([a-z]+)">([^<]*)<`)
)

// indexRows reads the index: each source's figures by "database/schema",
// and "down: <error>" for a source that is down.
func indexRows(t *testing.T, body string) map[string]map[string]string {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, m := range indexRow.FindAllStringSubmatch(body, -1) {
		r := map[string]string{}
		if m[1] != "" {
			r["down"] = m[3]
		}
		for _, f := range figure.FindAllStringSubmatch(m[3], -1) {
			r[f[1]] = f[2]
		}
		rows[m[2]] = r
	}
	return rows
}

// TestConsoleFleet runs `outbox console --config` on a fleet's file: two
// schemas (one named, one by a pattern) in the test database, one in a
// database of its own, and a database that cannot be reached. The index
// lists every source with its figures and the unreachable one as down
// (without its password); a source's pages work under its prefix, behind
// the one login, Host check and CSRF check of the console; an action lands
// in its source's schema only; a schema created since that the pattern
// matches appears.
func TestConsoleFleet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	admin := outboxtest.Pool(t)
	otherURL, other := outboxtest.Database(t, admin)
	prefix := outboxtest.UniqueName(t, "fc")
	named, matched, inOther, later := prefix+"_orders", prefix+"_t_1", prefix+"_billing", prefix+"_t_2"
	migrateFleetSchema(t, admin, named)
	migrateFleetSchema(t, admin, matched)
	migrateFleetSchema(t, other, inOther)

	// named: one event quarantined by a relay, one parked behind it; the
	// relay stays alive. inOther: two events pending, no relay.
	writeEvents(t, admin, named,
		outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "PaymentCaptured", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "PaymentRefunded", Payload: []byte(`{}`)})
	writeEvents(t, other, inOther,
		outbox.Event{AggregateType: "invoice", AggregateID: "i-1", Type: "InvoiceSent", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "invoice", AggregateID: "i-2", Type: "InvoiceSent", Payload: []byte(`{}`)})
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i := range msgs {
			errs[i] = outbox.Permanent(errors.New("422 refused"))
		}
		return errs
	})
	relay, err := outbox.NewRelay(admin, outbox.RelayConfig{Schema: named, Publisher: pub, PollInterval: 20 * time.Millisecond,
		HeartbeatInterval: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-rdone; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	namedAdmin, err := outbox.NewAdmin(admin, outbox.AdminConfig{Schema: named})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 60*time.Second, "the first event quarantined, the relay alive", func() bool {
		g, err := namedAdmin.Gauges(ctx)
		return err == nil && g.Quarantined == 1 && g.Pending == 1 && g.RelaysAlive == 1
	})
	q, err := namedAdmin.ListQuarantined(ctx, outbox.QuarantineFilter{Limit: 10})
	if err != nil || len(q) != 1 {
		t.Fatalf("quarantined: %v, %v", q, err)
	}

	const downPassword, token = "pw-DownDb-9f2k", "tok-fleet-console-51d7ae20"
	file := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(file, fmt.Appendf(nil, `databases:
  main: {url: %q, max_conns: 3}
  other: {url: %q}
  gone: {url: "postgres://outbox:%s@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2"}
destinations:
  events: {url: "nats://127.0.0.1:4222"}
sources:
  - {database: main, schema: %s, destination: events}
  - {database: main, schema_pattern: "%s_t_*", destination: events}
  - {database: other, schema: %s, destination: events}
  - {database: gone, schema: outbox, destination: events}
`, outboxtest.DatabaseURL(), otherURL, downPassword, named, prefix, inOther), 0o600); err != nil {
		t.Fatal(err)
	}

	p := startConsole(t, ctx, []string{"OUTBOX_CONSOLE_TOKEN=" + token}, "--config", file, "--listen", "127.0.0.1:0")
	origin := strings.TrimSuffix(p.base, "/")
	namedBase := p.base + "sources/main/" + named + "/"
	c := noRedirects()
	post := func(path string, form url.Values) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.base+strings.TrimPrefix(path, "/"), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Location")
	}

	// Without a login: the index and a source's pages lead to /login, a
	// source's action is refused, another Host is refused.
	for _, u := range []string{p.base, namedBase, namedBase + "quarantine", namedBase + "events/" + q[0].ID.String()} {
		if code, loc, _ := consoleGet(t, c, u, ""); code != http.StatusSeeOther || loc != "/login" {
			t.Errorf("GET %s without a login: %d to %q, want 303 to /login", u, code, loc)
		}
	}
	if code, _, _ := consoleGet(t, c, namedBase+"quarantine", "evil.example:"+p.port); code != http.StatusMisdirectedRequest {
		t.Errorf("GET a source's page for another Host: %d, want 421", code)
	}
	if code, _ := post("/sources/main/"+named+"/quarantine/skip", url.Values{"event_id": {q[0].ID.String()}, "reason": {"x"}}); code != http.StatusUnauthorized {
		t.Errorf("skip without a login: %d, want 401", code)
	}

	// One login for every source.
	if code, loc := post("/login", url.Values{"name": {"alice"}, "token": {token}}); code != http.StatusSeeOther || loc != "/" {
		t.Fatalf("login: %d to %q, want 303 to /", code, loc)
	}
	code, _, body := consoleGet(t, c, p.base, "")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	rows := indexRows(t, body)
	want := map[string]map[string]string{
		"main/" + named:    {"pending": "1", "quarantined": "1", "relays": "1"},
		"main/" + matched:  {"pending": "0", "quarantined": "0", "relays": "0"},
		"other/" + inOther: {"pending": "2", "quarantined": "0", "relays": "0"},
	}
	for src, figs := range want {
		for k, v := range figs {
			if rows[src][k] != v {
				t.Errorf("index, %s: %s = %q, want %q (row %v)", src, k, rows[src][k], v, rows[src])
			}
		}
		if !strings.Contains(body, `href="/sources/`+src+`/"`) {
			t.Errorf("index: no link to %s's console", src)
		}
	}
	if down, ok := rows["gone/"]["down"]; !ok || !strings.Contains(down, "down") {
		t.Errorf("index: the unreachable database is not shown down: %v", rows["gone/"])
	}
	if code, _, body := consoleGet(t, c, p.base+"sources/gone/outbox/quarantine", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "down") || strings.Contains(body, downPassword) {
		t.Errorf("GET a page of the unreachable database's source: %d %q, want 503 saying it is down", code, body)
	}
	if strings.Contains(body, downPassword) || strings.Contains(p.log(), downPassword) {
		t.Errorf("the unreachable database's password is printed")
	}
	if len(rows) != 4 {
		t.Errorf("index lists %d sources, want 4: %v", len(rows), rows)
	}

	// A source's pages under its prefix: every link and form stays under it.
	code, _, body = consoleGet(t, c, namedBase+"quarantine", "")
	if code != http.StatusOK || !strings.Contains(body, q[0].ID.String()) {
		t.Fatalf("GET %squarantine: %d\n%s", namedBase, code, body)
	}
	for _, bad := range regexp.MustCompile(`(?:href|action)="(/[^"]*)"`).FindAllStringSubmatch(body, -1) {
		if u := bad[1]; !strings.HasPrefix(u, "/sources/main/"+named+"/") && u != "/" && u != "/login" && u != "/logout" && !strings.HasPrefix(u, "/static/") {
			t.Errorf("a link or form of %s's quarantine page leaves its prefix: %s", named, u)
		}
	}
	for _, path := range []string{"", "quarantine", "inbox", "operations", "sideeffects", "events", "events/" + q[0].ID.String()} {
		if code, _, body := consoleGet(t, c, namedBase+path, ""); code != http.StatusOK {
			t.Errorf("GET %s%s: %d\n%s", namedBase, path, code, body)
		}
	}
	if code, _, _ := consoleGet(t, c, p.base+"static/console.css", ""); code != http.StatusOK {
		t.Errorf("GET /static/console.css: %d", code)
	}
	m := csrfValue.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on the quarantine page")
	}
	// A token that differs from the real one in its first character
	// (a fixed "0" was the real token whenever that began with "0").
	wrong := "0" + m[1][1:]
	if m[1][0] == '0' {
		wrong = "1" + m[1][1:]
	}
	if code, _ := post("/sources/main/"+named+"/quarantine/skip", url.Values{"event_id": {q[0].ID.String()}, "reason": {"x"}, "csrf": {wrong}}); code != http.StatusForbidden {
		t.Errorf("skip with a wrong CSRF token: %d, want 403", code)
	}
	// The same event id posted to another source is not found there.
	if code, _ := post("/sources/other/"+inOther+"/quarantine/skip", url.Values{"event_id": {q[0].ID.String()}, "reason": {"x"}, "csrf": {m[1]}}); code == http.StatusSeeOther {
		t.Errorf("skip of %s's event posted to %s: %d, want it not found", named, inOther, code)
	}
	code, loc := post("/sources/main/"+named+"/quarantine/skip", url.Values{"event_id": {q[0].ID.String()}, "reason": {"bad payload"}, "csrf": {m[1]}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/sources/main/"+named+"/quarantine?done=skipped") {
		t.Fatalf("skip: %d to %q", code, loc)
	}
	if got := operations(t, admin, named); len(got) != 1 || got[0] != "skip console:token:alice" {
		t.Errorf("%s's audit log: %q, want one skip by console:token:alice", named, got)
	}
	for _, s := range []struct {
		pool   *pgxpool.Pool
		schema string
	}{{admin, matched}, {other, inOther}} {
		if got := operations(t, s.pool, s.schema); len(got) != 0 {
			t.Errorf("%s's audit log: %q, want none", s.schema, got)
		}
	}

	// A schema created since, which the pattern matches: its console is
	// served at once, and the index lists it.
	migrateFleetSchema(t, admin, later)
	if code, _, body := consoleGet(t, c, p.base+"sources/main/"+later+"/", ""); code != http.StatusOK {
		t.Errorf("GET the new schema's console: %d\n%s", code, body)
	}
	if code, _, _ := consoleGet(t, c, p.base+"sources/main/"+prefix+"_not_matched/", ""); code != http.StatusNotFound {
		t.Errorf("GET a schema the file does not name: %d, want 404", code)
	}
	_, _, body = consoleGet(t, c, p.base, "")
	if r, ok := indexRows(t, body)["main/"+later]; !ok || r["pending"] != "0" {
		t.Errorf("index after creating %s: %v", later, indexRows(t, body))
	}

	// The other database goes away while the console runs: its source is
	// shown down, the others as before.
	other.Close()
	if _, err := admin.Exec(ctx, "DROP DATABASE "+strings.TrimPrefix(must(url.Parse(otherURL)).Path, "/")+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	_, _, body = consoleGet(t, c, p.base, "")
	rows = indexRows(t, body)
	if _, down := rows["other/"]["down"]; !down {
		t.Errorf("index after dropping the other database: %v, want other/ down", rows)
	}
	if r := rows["main/"+named]; r["relays"] != "1" || r["down"] != "" {
		t.Errorf("index after dropping the other database, %s: %v", named, r)
	}

	// Logging out ends the session for every source.
	code, _, body = consoleGet(t, c, p.base, "")
	if m = csrfValue.FindStringSubmatch(body); m == nil {
		t.Fatalf("no CSRF token on the index")
	}
	if code, _ := post("/logout", url.Values{"csrf": {m[1]}}); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	if code, loc, _ := consoleGet(t, c, namedBase+"quarantine", ""); code != http.StatusSeeOther || loc != "/login" {
		t.Errorf("GET a source's page after logging out: %d to %q, want 303 to /login", code, loc)
	}
	p.stop(t)
}

// TestConsoleFleetRefusesOneSourceFlags: --config names the sources; a flag
// that names one is a usage error.
func TestConsoleFleetRefusesOneSourceFlags(t *testing.T) {
	t.Parallel()
	outboxBinary(t) // built before runOutbox's clock starts
	for _, args := range [][]string{{"--schema", "x"}, {"--database-url", "postgres://h/db"}, {"--destination", "nats://h:4222"}, {"--inbox-schema", "x"}} {
		_, stderr, code := runOutbox(t, nil, append([]string{"console", "--config", "relay.yaml"}, args...)...)
		if code != 2 || !strings.Contains(stderr, args[0]+": not with --config") {
			t.Errorf("console --config %v: exit %d, %q; want a usage error", args, code, stderr)
		}
	}
	stdout, stderr, _ := runOutbox(t, nil, "console", "--help")
	if !strings.Contains(stdout+stderr, "-config FILE") || !strings.Contains(stdout+stderr, "/sources/DATABASE/SCHEMA/") {
		t.Errorf("console --help does not document --config:\n%s", stdout+stderr)
	}
}
