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

// TestAdvconDatabaseNameNeedingEscape: a source whose database's name (a
// key of the fleet's file, which the file does not restrict) needs
// escaping in a path is reachable at the URL the index links to.
func TestAdvconDatabaseNameNeedingEscape(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	names := []string{"eu/west", "a%b", "..", "x?y#z", "eu west"}
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(),
		Sources: func(context.Context) []outboxconsole.Source {
			var out []outboxconsole.Source
			for _, n := range names {
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
	if len(links) != len(names) {
		t.Errorf("index links %d sources, want %d", len(links), len(names))
	}
	for _, m := range links {
		link := strings.ReplaceAll(m[1], "&amp;", "&")
		code, body := c.get(link)
		if code != http.StatusOK {
			t.Errorf("GET %s (the index's link): %d, want 200\n%.200s", link, code, body)
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
