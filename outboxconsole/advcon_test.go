package outboxconsole_test

// Adversarial tests of NewMulti's isolation between sources: an action,
// a page or a signed form of one source must never reach another, nor a
// schema the console's sources do not name.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

func advconOps(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox_operations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var advconField = func(name string) *regexp.Regexp {
	return regexp.MustCompile(`name="` + name + `" value="([^"]*)"`)
}

// TestAdvconActionsStayInTheirSource: with one session and its one CSRF
// token, a retry, a skip or a bulk confirm posted under source B's prefix
// that names source A's events (or replays A's signed preview) changes
// neither A nor B; B's event page does not show A's event.
func TestAdvconActionsStayInTheirSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newFixture(t, 1, 2, 2)
	b := newFixture(t, 1, 2, 2)
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			return []outboxconsole.Source{{Database: "main", Schema: a.schema, Pool: a.pool}, {Database: "main", Schema: b.schema, Pool: b.pool}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	c.login("mallory")
	baseA, baseB := "/sources/main/"+a.schema, "/sources/main/"+b.schema

	for _, act := range []string{"/quarantine/retry", "/quarantine/skip"} {
		code, body := c.do(http.MethodPost, baseB+act, url.Values{"event_id": {a.quarantined[0].String()}, "reason": {"x"}, "csrf": {c.csrf}}, nil)
		if code == http.StatusSeeOther {
			t.Errorf("POST %s%s with A's event: %d (done?)\n%s", baseB, act, code, body)
		}
	}
	if code, _ := c.get(baseB + "/events/" + a.quarantined[0].String()); code == http.StatusOK {
		t.Errorf("B's event page shows A's event")
	}

	// A's signed bulk preview, confirmed under B's prefix.
	code, body := c.get(baseA + "/quarantine/bulk?action=skip&event_type=PaymentCaptured")
	if code != http.StatusOK {
		t.Fatalf("A's bulk preview: %d\n%s", code, body)
	}
	form := url.Values{"action": {"skip"}, "event_type": {"PaymentCaptured"}, "reason": {"replayed"}, "csrf": {c.csrf}}
	for _, f := range []string{"through", "n", "digest", "sig"} {
		m := advconField(f).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("A's bulk preview has no %s field:\n%s", f, body)
		}
		form.Set(f, m[1])
	}
	if code, body := c.do(http.MethodPost, baseB+"/quarantine/bulk", form, nil); code == http.StatusOK {
		t.Errorf("A's bulk confirm under B's prefix: %d\n%s", code, body)
	}
	if n := advconOps(t, a.pool, a.schema); n != 0 {
		t.Errorf("operations in A: %d, want 0", n)
	}
	if n := advconOps(t, b.pool, b.schema); n != 0 {
		t.Errorf("operations in B: %d, want 0", n)
	}
	for _, f := range []*fixture{a, b} {
		st, err := f.admin.Status(ctx)
		if err != nil || st.Quarantined != 2 {
			t.Errorf("%s: quarantined %d, %v; want 2", f.schema, st.Quarantined, err)
		}
	}
}

// TestAdvconNoSchemaOutsideSources: paths that try to name a schema the
// sources do not list (one with outbox tables in the same database,
// pg_catalog, public, the listed one in other case, dot segments and
// encoded slashes) reach no page and no action; the listed source's
// actions stay in its schema.
func TestAdvconNoSchemaOutsideSources(t *testing.T) {
	t.Parallel()
	pool, listed := outboxtest.Schema(t)
	pool2, hidden := outboxtest.Schema(t)
	var calls atomic.Int64
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			calls.Add(1)
			return []outboxconsole.Source{{Database: "main", Schema: listed, Pool: pool}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	c.login("mallory")
	up := strings.ToUpper(listed)
	for _, p := range []string{
		"/sources/main/" + hidden + "/",
		"/sources/main/" + hidden + "/operations",
		"/sources/main/..%2F" + hidden + "/",
		"/sources/main/" + listed + "%2F..%2F" + hidden + "/operations",
		"/sources/main/%2E%2E/" + hidden + "/operations",
		"/sources/main/" + listed + "/..%2F" + hidden + "/operations",
		"/sources/main/" + listed + "/%2E%2E/%2E%2E/" + hidden + "/operations",
		"/sources/main/" + up + "/operations",
		"/sources/main/pg_catalog/",
		"/sources/main/public/operations",
		"/sources/main/" + url.PathEscape(`"`+hidden+`"`) + "/operations",
		"/sources/main%00/" + listed + "/operations",
		"/sources/%6Dain/" + hidden + "/operations",
	} {
		code, body := c.get(p)
		if strings.Contains(body, hidden) && code == http.StatusOK {
			t.Errorf("GET %s: %d, a page of %s\n%s", p, code, hidden, body)
		}
		if code == http.StatusOK && !strings.HasPrefix(p, "/sources/main/"+listed+"/") {
			t.Errorf("GET %s: %d, want no page", p, code)
		}
		if code == http.StatusInternalServerError {
			t.Errorf("GET %s: 500\n%s", p, body)
		}
		for _, act := range []string{"/quarantine/skip", "/inbox/resolve"} {
			pp := strings.TrimSuffix(strings.TrimSuffix(p, "/operations"), "/") + act
			code, body := c.do(http.MethodPost, pp, url.Values{"event_id": {"00000000-0000-0000-0000-000000000001"}, "reason": {"x"},
				"consumer": {"c"}, "aggregate_type": {"t"}, "aggregate_id": {"i"}, "csrf": {c.csrf}}, nil)
			if code == http.StatusSeeOther {
				t.Errorf("POST %s: %d\n%s", pp, code, body)
			}
		}
	}
	if n := advconOps(t, pool2, hidden); n != 0 {
		t.Errorf("operations in the unlisted schema %s: %d", hidden, n)
	}
	t.Logf("Sources called %d times for the probes", calls.Load())
}

// TestAdvconDatabaseNameNeedingEscape: a source whose database's name
// would need escaping in a path, or that a path cleaner rewrites ("..",
// which no request path can hold as a segment), is shown down with why and
// no link; its pages are not served. A name of letters, digits, '_', '.'
// and '-' is reachable at the URL the index links to. (The fleet's file
// refuses such database keys: outboxfleet's TestConfigErrorsAreClear.)
func TestAdvconDatabaseNameNeedingEscape(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	bad := []string{"eu/west", "a%b", "..", "x?y#z", "eu west"}
	good := []string{"eu-west.1", "_main"}
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			var out []outboxconsole.Source
			for _, n := range append(append([]string{}, bad...), good...) {
				out = append(out, outboxconsole.Source{Database: n, Schema: schema, Pool: pool})
			}
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	c.login("bob")
	code, body := c.get("/")
	if code != http.StatusOK {
		t.Fatalf("index: %d", code)
	}
	links := regexp.MustCompile(`href="(/sources/[^"]*)"`).FindAllStringSubmatch(body, -1)
	if len(links) != len(good) {
		t.Errorf("index links %d sources, want %d (the valid names)", len(links), len(good))
	}
	for _, m := range links {
		link := strings.ReplaceAll(m[1], "&amp;", "&")
		code, body := c.get(link)
		if code != http.StatusOK {
			t.Errorf("GET %s (the index's link): %d, want 200\n%.200s", link, code, body)
		}
	}
	if n := strings.Count(body, `<span class="state down">down</span> database: invalid name`); n != len(bad) {
		t.Errorf("index shows %d sources down for their database's name, want %d\n%s", n, len(bad), body)
	}
	for _, p := range []string{"/sources/eu%2Fwest/" + schema + "/", "/sources/a%25b/" + schema + "/", "/sources/eu%20west/" + schema + "/"} {
		if code, _ := c.get(p); code == http.StatusOK {
			t.Errorf("GET %s: 200, want no page", p)
		}
	}
}

// TestAdvconManySourcesOneSmallPool: a database of many sources (a
// pattern matching hundreds of tenants' schemas) whose pool is small: the
// index reads every source's figures at once, each bounded by
// FiguresTimeout from the start, so sources queued behind their siblings
// for one of the pool's connections show as down though the database
// answers every query at once.
func TestAdvconManySourcesOneSmallPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := outboxtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const n = 600
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(), FiguresTimeout: time.Second,
		Sources: func(context.Context) []outboxconsole.Source {
			out := make([]outboxconsole.Source, n)
			for i := range out {
				out[i] = outboxconsole.Source{Database: fmt.Sprintf("tenant%03d", i), Schema: schema, Pool: pool}
			}
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	c.login("bob")
	start := time.Now()
	code, body := c.get("/")
	took := time.Since(start)
	if code != http.StatusOK {
		t.Fatalf("index: %d", code)
	}
	down := strings.Count(body, `<span class="state down">down</span>`)
	t.Logf("index of %d sources on a pool of 1: %s, %d down", n, took, down)
	if down > 0 {
		m := regexp.MustCompile(`(?s)class="state down">down</span>(.{0,120})`).FindStringSubmatch(body)
		t.Errorf("%d of %d healthy sources shown as down (the database answers; their figures queued for the pool): %s", down, n, m[1])
	}
}

// TestAdvconMultiModes: the gate's modes hold under every source's prefix:
// read-only refuses actions with a valid session and CSRF token and shows
// no action form; without a token (and no proxy) nobody can act or log in;
// a proxy's identity header from an untrusted address is refused; a session
// cookie copied before a logout opens no source afterwards.
func TestAdvconMultiModes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1, 2)
	pool2, other := outboxtest.Schema(t)
	sources := func(context.Context) []outboxconsole.Source {
		return []outboxconsole.Source{{Database: "main", Schema: f.schema, Pool: f.pool}, {Database: "main", Schema: other, Pool: pool2}}
	}
	start := func(cfg outboxconsole.MultiConfig) (*httptest.Server, *client) {
		cfg.Sources, cfg.Logger = sources, discard()
		h, err := outboxconsole.NewMulti(cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv, newClient(t, srv)
	}
	base := "/sources/main/" + f.schema
	skip := url.Values{"event_id": {f.quarantined[0].String()}, "reason": {"x"}}

	// Read-only with a token.
	_, c := start(outboxconsole.MultiConfig{Token: testToken, ReadOnly: true})
	c.login("ro")
	skip.Set("csrf", c.csrf)
	if code, _ := c.do(http.MethodPost, base+"/quarantine/skip", skip, nil); code != http.StatusForbidden {
		t.Errorf("read-only: skip with a session: %d, want 403", code)
	}
	if _, body := c.get(base + "/quarantine"); strings.Contains(body, "/quarantine/skip") || strings.Contains(body, "/quarantine/retry") {
		t.Errorf("read-only: the quarantine page offers actions")
	}

	// No token, no proxy: read-only, no login.
	_, c = start(outboxconsole.MultiConfig{})
	if code, _ := c.get(base + "/quarantine"); code != http.StatusOK {
		t.Errorf("no token: GET a source's page: %d, want 200", code)
	}
	if code, _ := c.do(http.MethodPost, "/login", url.Values{"name": {"x"}, "token": {""}}, nil); code != http.StatusForbidden {
		t.Errorf("no token: POST /login: %d, want 403", code)
	}
	if code, _ := c.do(http.MethodPost, base+"/quarantine/skip", skip, nil); code != http.StatusForbidden {
		t.Errorf("no token: skip: %d, want 403", code)
	}

	// A proxy that is not this client's address.
	_, c = start(outboxconsole.MultiConfig{AuthProxyHeader: proxyHeader, TrustedProxies: []string{"10.9.9.9"}})
	for _, p := range []string{"/", base + "/", base + "/quarantine"} {
		if code, _ := c.do(http.MethodGet, p, nil, asProxy("admin")); code != http.StatusForbidden {
			t.Errorf("proxy header from an untrusted address, GET %s: %d, want 403", p, code)
		}
	}
	if code, _ := c.do(http.MethodPost, base+"/quarantine/skip", skip, asProxy("admin")); code != http.StatusForbidden {
		t.Errorf("proxy header from an untrusted address, skip: %d, want 403", code)
	}

	// Logout, then the copied cookie under each source.
	srv, c := start(outboxconsole.MultiConfig{Token: testToken})
	c.login("alice")
	u, _ := url.Parse(srv.URL)
	stolen := *c.http.Jar.Cookies(u)[0]
	csrf := c.csrf
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	replay := newClient(t, srv)
	replay.http.Jar.SetCookies(u, []*http.Cookie{&stolen})
	for _, b := range []string{base, "/sources/main/" + other} {
		if code, _ := replay.get(b + "/operations"); code != http.StatusSeeOther {
			t.Errorf("after logout, the copied cookie on %s: %d, want 303 to the login", b, code)
		}
		skip.Set("csrf", csrf)
		if code, _ := replay.do(http.MethodPost, b+"/quarantine/skip", skip, nil); code != http.StatusUnauthorized {
			t.Errorf("after logout, the copied cookie posts to %s: %d, want 401", b, code)
		}
	}
	if n := advconOps(t, f.pool, f.schema); n != 0 {
		t.Errorf("operations in %s: %d, want 0", f.schema, n)
	}
}

// advconTenant makes a role that owns schema and the given tables of it,
// as a less trusted tenant who migrated their own schema (one a pattern
// source matches) does; it is dropped when the test ends.
func advconTenant(t *testing.T, pool *pgxpool.Pool, schema string, tables ...string) string {
	t.Helper()
	ctx := context.Background()
	role := outboxtest.UniqueName(t, "tenant")
	if _, err := pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range []string{"REASSIGN OWNED BY " + role + " TO CURRENT_USER", "DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := pool.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	if _, err := pool.Exec(ctx, "ALTER SCHEMA "+schema+" OWNER TO "+role); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if _, err := pool.Exec(ctx, "ALTER TABLE "+schema+"."+tb+" OWNER TO "+role); err != nil {
			t.Fatal(err)
		}
	}
	return role
}

// asTenant runs the tenant's SQL under its role.
func asTenant(t *testing.T, pool *pgxpool.Pool, role string, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
		t.Fatal(err)
	}
	for _, q := range sqls {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("as the tenant: %s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAdvconTenantSchemaCannotEscalate: a source's schema owned by a less
// trusted role (a tenant who can create schemas that a pattern matches)
// must not get its code run with the console's database role. The tenant
// puts a trigger on its outbox_operations; an operator skips a
// quarantined event of that source in the console; the trigger runs as
// the console's role (here a superuser) and makes the tenant a superuser.
func TestAdvconTenantSchemaCannotEscalate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 0, 1, 1)
	role := advconTenant(t, f.pool, f.schema, "outbox_operations")
	asTenant(t, f.pool, role,
		`CREATE FUNCTION `+f.schema+`.audit_hook() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    EXECUTE format('ALTER ROLE %I SUPERUSER', '`+role+`');
  END IF;
  RETURN NEW;
END $$`,
		`CREATE TRIGGER audit_hook AFTER INSERT ON `+f.schema+`.outbox_operations FOR EACH ROW EXECUTE FUNCTION `+f.schema+`.audit_hook()`)
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			return []outboxconsole.Source{{Database: "main", Schema: f.schema, Pool: f.pool}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	c.login("bob")
	code, body := c.do(http.MethodPost, "/sources/main/"+f.schema+"/quarantine/skip",
		url.Values{"event_id": {f.quarantined[0].String()}, "reason": {"settled by hand"}, "csrf": {c.csrf}}, nil)
	t.Logf("skip in the tenant's source: %d %.200s", code, body)
	var super bool
	if err := f.pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = $1", role).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		t.Errorf("the tenant's role %s became a superuser: its trigger ran with the console's role when an operator skipped an event of its source", role)
	}
}

// TestAdvconTenantCodeOnIndex: merely loading the index runs a tenant's
// code with the console's role: its outbox_relays replaced by a view over
// its own function, which reports whom it ran as.
func TestAdvconTenantCodeOnIndex(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	role := advconTenant(t, pool, schema, "outbox_relays")
	asTenant(t, pool, role,
		`CREATE FUNCTION `+schema+`.relays() RETURNS TABLE(relay_id text, heartbeat_at timestamptz, expires_at timestamptz) LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'tenant code ran as % (superuser %)', current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
END $$`,
		`DROP TABLE `+schema+`.outbox_relays`,
		`CREATE VIEW `+schema+`.outbox_relays AS SELECT * FROM `+schema+`.relays()`)
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			return []outboxconsole.Source{{Database: "main", Schema: schema, Pool: pool}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	c.login("bob")
	_, body := c.get("/")
	if m := regexp.MustCompile(`tenant code ran as [^<]*`).FindString(body); m != "" && !strings.Contains(m, role) {
		t.Errorf("loading the index ran the tenant's function as another role than the tenant's: %q", m)
	}
}

// TestAdvconLoginLeadsHome: the login of a console of several sources
// leads to its index whatever the request says (a next or return
// parameter, a Referer of another site): no open redirect.
func TestAdvconLoginLeadsHome(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			return []outboxconsole.Source{{Database: "main", Schema: schema, Pool: pool}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, q := range []string{"?next=//evil.example/", "?next=https://evil.example/", "?return_to=/%2F%2Fevil.example", "?redirect=%5C%5Cevil.example"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/login"+q, strings.NewReader(url.Values{"name": {"bob"}, "token": {testToken},
			"next": {"//evil.example/"}, "return_to": {"https://evil.example/"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", srv.URL)
		c := newClient(t, srv)
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/" {
			t.Errorf("POST /login%s: %d to %q, want 303 to /", q, resp.StatusCode, loc)
		}
	}
	c := newClient(t, srv)
	c.login("bob")
	for _, p := range []string{"/sources/main/" + url.PathEscape("/evil.example"), "/sources//evil.example/x", "/sources/main/" + schema + "//evil.example/"} {
		code, _ := c.get(p)
		req, _ := http.NewRequest(http.MethodGet, srv.URL+p, nil)
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, "//") || strings.Contains(loc, "://") || strings.HasPrefix(loc, `/\`) {
			t.Errorf("GET %s: %d to %q: leaves the console", p, code, loc)
		}
	}
}
