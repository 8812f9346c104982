package outboxconsole_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

const testToken = "console-test-token-5f1d0c2a9e"

// queryCounter counts the queries run on a pool.
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}
func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func countingPool(t *testing.T) (*pgxpool.Pool, *queryCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	qc := &queryCounter{}
	cfg.ConnConfig.Tracer = qc
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, qc
}

func serve(t *testing.T, cfg outboxconsole.Config) *httptest.Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discard()
	}
	h, err := outboxconsole.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// client is a browser-like client of one console: it keeps cookies and
// sends the console's Origin on POSTs unless told otherwise.
type client struct {
	t    *testing.T
	srv  *httptest.Server
	http *http.Client
	csrf string
}

func newClient(t *testing.T, srv *httptest.Server) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, srv: srv, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(method, path string, form url.Values, header map[string]string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", c.srv.URL)
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (c *client) get(path string) (int, string) { return c.do(http.MethodGet, path, nil, nil) }

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// login logs in as name and keeps the session's CSRF token (read from the
// login page's header, which touches no database).
func (c *client) login(name string) {
	c.t.Helper()
	if code, body := c.do(http.MethodPost, "/login", url.Values{"name": {name}, "token": {testToken}}, nil); code != http.StatusSeeOther {
		c.t.Fatalf("login: %d %s", code, body)
	}
	_, body := c.get("/login")
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no CSRF token on the page after login:\n%s", body)
	}
	c.csrf = m[1]
}

// TestPostRefusedBeforeRoutingAndDatabase: every POST without a valid
// session, CSRF token and origin is answered 401 or 403 (any path, even one
// that does not exist: before routing) without a single query; a valid one
// does reach the database.
func TestPostRefusedBeforeRoutingAndDatabase(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	pool, qc := countingPool(t)
	srv := serve(t, outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken})
	anon := newClient(t, srv)
	alice := newClient(t, srv)
	alice.login("alice")
	id := uuid.NewString()
	forged := newClient(t, srv)
	forged.login("mallory")
	u, _ := url.Parse(srv.URL)
	for _, ck := range forged.http.Jar.Cookies(u) {
		parts := strings.SplitN(ck.Value, ".", 2)
		ck.Value = "YWxpY2U" + "." + parts[1] // "alice" with mallory's signature
		forged.http.Jar.SetCookies(u, []*http.Cookie{ck})
	}
	cases := []struct {
		name   string
		c      *client
		path   string
		form   url.Values
		header map[string]string
		want   int
	}{
		{"retry without session", anon, "/quarantine/retry", url.Values{"event_id": {id}}, nil, 401},
		{"skip without session", anon, "/quarantine/skip", url.Values{"event_id": {id}, "reason": {"x"}}, nil, 401},
		{"unknown path without session", anon, "/no/such/page", nil, nil, 401},
		{"replay without session", anon, "/replay", url.Values{"aggregate_type": {"order"}, "aggregate_id": {"1"}}, nil, 401},
		{"login with a wrong token", anon, "/login", url.Values{"name": {"eve"}, "token": {testToken + "x"}}, nil, 401},
		{"login with no token", anon, "/login", url.Values{"name": {"eve"}}, nil, 401},
		{"login from another origin", anon, "/login", url.Values{"name": {"eve"}, "token": {testToken}}, map[string]string{"Origin": "http://evil.example"}, 403},
		{"forged session", forged, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {forged.csrf}}, nil, 401},
		{"no CSRF token", alice, "/quarantine/retry", url.Values{"event_id": {id}}, nil, 403},
		{"wrong CSRF token", alice, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {strings.Repeat("0", 64)}}, nil, 403},
		{"another session's CSRF token", alice, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {forged.csrf}}, nil, 403},
		{"from another origin", alice, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {alice.csrf}}, map[string]string{"Origin": "http://evil.example"}, 403},
		{"without Origin or Referer", alice, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {alice.csrf}}, map[string]string{"Origin": ""}, 403},
		{"with a foreign Referer", alice, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {alice.csrf}}, map[string]string{"Origin": "", "Referer": "http://evil.example/x"}, 403},
	}
	before := qc.n.Load()
	for _, tc := range cases {
		if code, body := tc.c.do(http.MethodPost, tc.path, tc.form, tc.header); code != tc.want {
			t.Errorf("%s: got %d, want %d (%s)", tc.name, code, tc.want, strings.TrimSpace(body))
		}
	}
	if code, _ := anon.do(http.MethodDelete, "/", nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: got %d, want 405", code)
	}
	if n := qc.n.Load() - before; n != 0 {
		t.Fatalf("%d queries ran for refused requests; want none", n)
	}
	// The control: the same retry, allowed, reaches the database (and finds
	// no such event). With a Referer instead of Origin too.
	if code, body := alice.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {alice.csrf}}, nil); code != http.StatusNotFound {
		t.Fatalf("allowed retry of an unknown event: %d %s; want 404", code, body)
	}
	if code, _ := alice.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {id}, "csrf": {alice.csrf}}, map[string]string{"Origin": "", "Referer": srv.URL + "/quarantine"}); code != http.StatusNotFound {
		t.Fatalf("allowed retry with a Referer: %d; want 404", code)
	}
	if qc.n.Load() == before {
		t.Fatal("the allowed retry ran no query: the counter does not count")
	}
}

// TestReadOnlyRefusesAndHidesActions: a read-only console (explicitly, or
// for want of a token) renders no action form and refuses every POST but
// logging in and out (which a console with a token needs for its pages),
// with 403 and no query.
func TestReadOnlyRefusesAndHidesActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1, 2)
	for _, cfg := range []outboxconsole.Config{
		{Pool: f.pool, Schema: f.schema, Token: testToken, ReadOnly: true},
		{Pool: f.pool, Schema: f.schema},
	} {
		c := newClient(t, serve(t, cfg))
		if cfg.Token != "" {
			c.login("alice")
		} else if code, _ := c.do(http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}}, nil); code != http.StatusForbidden {
			t.Errorf("read-only login without a token: %d, want 403", code)
		}
		code, body := c.get("/quarantine")
		if code != http.StatusOK || !strings.Contains(body, f.quarantined[0].String()) {
			t.Fatalf("read-only quarantine page: %d, event %s not listed:\n%s", code, f.quarantined[0], body)
		}
		for _, s := range []string{`action="/quarantine/retry"`, `action="/quarantine/skip"`, `action="/replay"`} {
			if strings.Contains(body, s) {
				t.Errorf("read-only page renders %s", s)
			}
		}
		if !strings.Contains(body, "read-only") {
			t.Error("read-only page does not say it is read-only")
		}
		if code, _ := c.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {f.quarantined[0].String()}, "csrf": {c.csrf}}, nil); code != http.StatusForbidden {
			t.Errorf("read-only retry: %d, want 403", code)
		}
	}
	if st, err := f.admin.Status(context.Background()); err != nil || st.Quarantined != 1 || len(st.RecentOperations) != 0 {
		t.Fatalf("after read-only POSTs: %d quarantined, %d operations (%v); want 1 and none", st.Quarantined, len(st.RecentOperations), err)
	}
}

// TestPagesEscapeAndHideSecrets: every page renders, a payload's markup is
// shown escaped, and the token appears on no page.
func TestPagesEscapeAndHideSecrets(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 2, 3)
	f.waitOnGap(t, "inventory", "ord-0001")
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	check := func(who string, pagesOK bool) {
		for _, path := range []string{"/", "/quarantine", "/inbox", "/operations", "/login", "/quarantine?type=payment", "/static/console.css"} {
			code, body := c.get(path)
			want := http.StatusOK
			if !pagesOK && path != "/login" && !strings.HasPrefix(path, "/static/") {
				want = http.StatusSeeOther // to the login page
			}
			if code != want {
				t.Fatalf("%s GET %s: %d, want %d\n%s", who, path, code, want, body)
			}
			if strings.Contains(body, testToken) {
				t.Fatalf("%s GET %s renders the token", who, path)
			}
		}
	}
	check("anonymous", false)
	c.login("alice")
	check("alice", true)
	_, body := c.get("/quarantine")
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;") {
		t.Fatalf("the payload preview is not escaped:\n%s", body)
	}
	if !strings.Contains(body, "merchant &lt;acme&gt;") {
		t.Fatalf("the last error is not shown escaped:\n%s", body)
	}
	if _, body = c.get("/"); !strings.Contains(body, `<svg class="chart"`) || !strings.Contains(body, "inventory") {
		t.Fatalf("the overview has no chart or no inbox consumer:\n%s", body)
	}
	if _, body = c.get("/inbox"); !strings.Contains(body, "order/ord-0001") {
		t.Fatalf("the inbox page does not list the waiting aggregate:\n%s", body)
	}
}

var eventRowRE = regexp.MustCompile(`data-event="([0-9a-f-]{36})"`)
var nextRE = regexp.MustCompile(`href="(/quarantine\?[^"]+)" id="next"`)

// TestQuarantinePagesWalkEveryEventOnce: with pages of 2, following the
// next-page links lists every quarantined event once, in order.
func TestQuarantinePagesWalkEveryEventOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 5, 2)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, PageSize: 2}))
	var seen []string
	path := "/quarantine"
	for pages := 0; path != ""; pages++ {
		if pages > 5 {
			t.Fatal("more than 5 pages for 5 events in pages of 2")
		}
		code, body := c.get(path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		for _, m := range eventRowRE.FindAllStringSubmatch(body, -1) {
			seen = append(seen, m[1])
		}
		path = ""
		if m := nextRE.FindStringSubmatch(body); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != len(f.quarantined) {
		t.Fatalf("pages listed %d events, want %d: %v", len(seen), len(f.quarantined), seen)
	}
	for i, id := range f.quarantined {
		if seen[i] != id.String() {
			t.Fatalf("event %d listed %s, want %s (order: %v)", i, seen[i], id, seen)
		}
	}
}

// TestActionsAreAudited: a retry and a skip from the console land in
// outbox_operations as console:token:<name> (a token login) with the skip's
// reason, and do what the CLI's do. A login name with a colon is refused,
// so that a token login never reads as another kind (console:proxy:…).
func TestActionsAreAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 2, 3)
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken})
	if code, _ := newClient(t, srv).do(http.MethodPost, "/login", url.Values{"name": {"proxy:alice"}, "token": {testToken}}, nil); code != http.StatusBadRequest {
		t.Fatalf("login as proxy:alice: %d, want 400", code)
	}
	c := newClient(t, srv)
	c.login("alice")
	retried, skipped := f.quarantined[0], f.quarantined[1]
	ev, err := f.admin.Event(ctx, retried)
	if err != nil {
		t.Fatal(err)
	}
	f.refuse.Delete(ev.AggregateID)
	if code, body := c.do(http.MethodPost, "/quarantine/retry", url.Values{"event_id": {retried.String()}, "csrf": {c.csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("retry: %d %s", code, body)
	}
	if code, body := c.do(http.MethodPost, "/quarantine/skip", url.Values{"event_id": {skipped.String()}, "csrf": {c.csrf}, "reason": {"  "}}, nil); code != http.StatusBadRequest {
		t.Fatalf("skip without a reason: %d %s; want 400", code, body)
	}
	if code, body := c.do(http.MethodPost, "/quarantine/skip", url.Values{"event_id": {skipped.String()}, "csrf": {c.csrf}, "reason": {"merchant will never accept EUR"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("skip: %d %s", code, body)
	}
	if code, _ := c.do(http.MethodPost, "/quarantine/skip", url.Values{"event_id": {skipped.String()}, "csrf": {c.csrf}, "reason": {"again"}}, nil); code != http.StatusConflict {
		t.Fatalf("skip of a skipped event: %d; want 409", code)
	}
	checkAudit(t, f, "console:token:alice", retried, skipped, "merchant will never accept EUR")
	outboxtest.Eventually(t, 30*time.Second, "the retried event and its aggregate published", func() bool {
		e, err := f.admin.Event(ctx, retried)
		return err == nil && e.State() == "published"
	})
	if e, err := f.admin.Event(ctx, skipped); err != nil || e.State() != "skipped" || e.SkippedBy != "console:token:alice" {
		t.Fatalf("skipped event: %+v, %v", e, err)
	}
}

// checkAudit asserts the audit rows of the two events: a retry and a skip
// by actor, and nothing else.
func checkAudit(t testing.TB, f *fixture, actor string, retried, skipped uuid.UUID, reason string) {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT action, actor, event_id, coalesce(reason, '') FROM `+f.schema+`.outbox_operations
WHERE event_id = ANY($1) ORDER BY operation_id`, []uuid.UUID{retried, skipped})
	if err != nil {
		t.Fatal(err)
	}
	type op struct {
		action, actor string
		event         uuid.UUID
		reason        string
	}
	var ops []op
	for rows.Next() {
		var o op
		if err := rows.Scan(&o.action, &o.actor, &o.event, &o.reason); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []op{{"retry", actor, retried, ""}, {"skip", actor, skipped, reason}}
	if len(ops) != len(want) {
		t.Fatalf("audit log: %+v, want %+v", ops, want)
	}
	for i := range want {
		if ops[i] != want[i] {
			t.Fatalf("audit row %d: %+v, want %+v", i, ops[i], want[i])
		}
	}
}

// TestReplayOneAggregate: with a publisher, a logged-in operator replays one
// aggregate's published events from the overview, in order, and the replay
// is in the audit log by console:token:<name>; without one, replay is neither
// offered nor accepted.
func TestReplayOneAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 3, 0, 4)
	var mu sync.Mutex
	var sent []outbox.Message
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, msgs...)
		return make([]error, len(msgs))
	})
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken, Publisher: pub}))
	c.login("bob")
	if _, body := c.get("/"); !strings.Contains(body, `action="/replay"`) {
		t.Fatal("the overview offers no replay although a publisher is set")
	}
	code, body := c.do(http.MethodPost, "/replay", url.Values{"aggregate_type": {"order"}, "aggregate_id": {"ord-0001"}, "csrf": {c.csrf}}, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("replay: %d %s", code, body)
	}
	mu.Lock()
	got := append([]outbox.Message(nil), sent...)
	mu.Unlock()
	if len(got) != 4 {
		t.Fatalf("replayed %d messages, want the aggregate's 4", len(got))
	}
	for i, m := range got {
		if m.AggregateID != "ord-0001" || m.Sequence != int64(i+1) || m.ReplayID == uuid.Nil {
			t.Fatalf("replayed message %d: %s #%d (replay %s); want ord-0001 #%d with a replay id", i, m.AggregateID, m.Sequence, m.ReplayID, i+1)
		}
	}
	ops, err := f.admin.Operations(ctx, outbox.OperationFilter{})
	if err != nil || len(ops) != 1 || ops[0].Action != "replay" || ops[0].Actor != "console:token:bob" || ops[0].Detail["aggregate_id"] != "ord-0001" {
		t.Fatalf("audit log after the replay: %+v, %v; want one replay of ord-0001 by console:token:bob", ops, err)
	}
	if code, _ := c.do(http.MethodPost, "/replay", url.Values{"aggregate_type": {"order"}, "csrf": {c.csrf}}, nil); code != http.StatusBadRequest {
		t.Fatalf("replay without an aggregate id: %d, want 400", code)
	}

	bare := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	bare.login("bob")
	if _, body := bare.get("/"); strings.Contains(body, `action="/replay"`) {
		t.Fatal("the overview offers replay without a publisher")
	}
	if code, _ := bare.do(http.MethodPost, "/replay", url.Values{"aggregate_type": {"order"}, "aggregate_id": {"ord-0001"}, "csrf": {bare.csrf}}, nil); code != http.StatusNotFound {
		t.Fatalf("replay without a publisher: %d, want 404", code)
	}
}
