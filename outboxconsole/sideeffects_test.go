package outboxconsole_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
	"github.com/pgoutbox/outbox/sideeffect"
)

// seFixture is a schema whose consumer made external calls (package
// sideeffect, mode Neither: an unknown outcome is parked): parked attempts,
// unknown ones and one in flight (its call blocks until the test ends).
type seFixture struct {
	pool            *pgxpool.Pool
	schema          string
	admin           *sideeffect.Admin
	parked, unknown []string
	inFlight        string
}

const seName = "payments.charge"

func newSEFixture(t testing.TB, parked, unknown int) *seFixture {
	t.Helper()
	pool, schema := outboxtest.Schema(t)
	return addAttempts(t, pool, schema, parked, unknown)
}

// addAttempts records the attempts of seFixture in schema.
func addAttempts(t testing.TB, pool *pgxpool.Pool, schema string, parked, unknown int) *seFixture {
	t.Helper()
	ctx := context.Background()
	f := &seFixture{pool: pool, schema: schema}
	var err error
	if f.admin, err = sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	// A long call timeout, so that the in-flight attempt's lease (three
	// times as long) outlasts the test.
	c, err := sideeffect.New(pool, sideeffect.Config{Name: seName, Schema: schema, Mode: sideeffect.Neither, Logger: discard(), CallTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The provider's answer is lost: the outcome is unknown.
	lost := func(context.Context, string) ([]byte, error) {
		return nil, errors.New("read tcp 10.0.0.7:443: connection reset by peer <after the request was sent>")
	}
	req := []byte(`{"amount_cents":1299}`)
	for i := range parked + unknown {
		key := fmt.Sprintf("evt-%04d/charge", i)
		if _, err := c.Do(ctx, key, req, lost); !errors.Is(err, sideeffect.ErrUnknown) {
			t.Fatalf("first call of %s: %v; want unknown", key, err)
		}
		if i < parked {
			// Called again: mode Neither parks it for an operator.
			if _, err := c.Do(ctx, key, req, lost); !errors.Is(err, sideeffect.ErrParked) {
				t.Fatalf("second call of %s: %v; want parked", key, err)
			}
			f.parked = append(f.parked, key)
		} else {
			f.unknown = append(f.unknown, key)
		}
	}
	f.inFlight = "evt-9999/charge"
	release, called := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, f.inFlight, req, func(context.Context, string) ([]byte, error) {
			close(called)
			<-release
			return []byte(`{"id":"ch_1"}`), nil
		})
		done <- err
	}()
	<-called
	t.Cleanup(func() {
		close(release)
		if err := <-done; err != nil {
			t.Errorf("the in-flight call: %v", err)
		}
	})
	return f
}

var seRowRE = regexp.MustCompile(`data-key="([^"]+)"`)

func keysOn(body string) []string {
	var keys []string
	for _, m := range seRowRE.FindAllStringSubmatch(body, -1) {
		keys = append(keys, m[1])
	}
	return keys
}

// TestSideEffectsPageAndResolve: the side-effect page needs a login, lists
// the parked attempts and, on its other tab, the unknown and in-flight
// ones; the overview shows the parked and unknown count; a resolution is
// refused without a session or the CSRF token (nothing changes), needs a
// reason, and otherwise settles the attempt through Admin.Resolve, with an
// audit row by console:token:<name>; a settled or in-flight attempt is a
// conflict.
func TestSideEffectsPageAndResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newSEFixture(t, 3, 2)
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken})
	c := newClient(t, srv)
	if code, _ := c.get("/sideeffects"); code != http.StatusSeeOther {
		t.Fatalf("side-effect page without a login: %d, want 303 to the login page", code)
	}
	c.login("alice")

	code, body := c.get("/sideeffects")
	if code != http.StatusOK {
		t.Fatalf("side-effect page: %d\n%s", code, body)
	}
	if got := keysOn(body); strings.Join(got, ",") != strings.Join(f.parked, ",") {
		t.Fatalf("parked tab lists %v, want %v", got, f.parked)
	}
	for _, s := range []string{`id="se-parked">3<`, `id="se-unknown">2<`, `id="se-inflight">1<`, `action="/sideeffects/resolve"`, "connection reset by peer &lt;after the request was sent&gt;"} {
		if !strings.Contains(body, s) {
			t.Errorf("side-effect page lacks %s", s)
		}
	}
	_, body = c.get("/sideeffects?show=open")
	got := keysOn(body)
	want := append(append([]string(nil), f.unknown...), f.inFlight)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("open tab lists %v, want %v", got, want)
	}
	if !strings.Contains(body, "in flight: wait for its lease") {
		t.Error("the in-flight attempt is offered a resolution")
	}
	_, body = c.get("/")
	if !strings.Contains(body, `id="sideeffects-stuck">5<`) || !strings.Contains(body, `id="sideeffects-alert"`) {
		t.Fatalf("the overview does not show the 5 parked and unknown attempts:\n%s", body)
	}

	key := f.parked[0]
	form := func(as, reason string, csrf string) url.Values {
		return url.Values{"name": {seName}, "key": {key}, "as": {as}, "reason": {reason}, "csrf": {csrf}}
	}
	anon := newClient(t, srv)
	if code, _ := anon.do(http.MethodPost, "/sideeffects/resolve", form("succeeded", "x", ""), nil); code != http.StatusUnauthorized {
		t.Errorf("resolve without a session: %d, want 401", code)
	}
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", form("succeeded", "x", ""), nil); code != http.StatusForbidden {
		t.Errorf("resolve without the CSRF token: %d, want 403", code)
	}
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", form("succeeded", "x", c.csrf), map[string]string{"Origin": "http://evil.example"}); code != http.StatusForbidden {
		t.Errorf("resolve from another origin: %d, want 403", code)
	}
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", form("succeeded", "  ", c.csrf), nil); code != http.StatusBadRequest {
		t.Errorf("resolve without a reason: %d, want 400", code)
	}
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", form("vanished", "x", c.csrf), nil); code != http.StatusBadRequest {
		t.Errorf("resolve as nothing known: %d, want 400", code)
	}
	if a, err := f.admin.Attempt(ctx, seName, key); err != nil || a.State != sideeffect.Parked || a.Operator != nil {
		t.Fatalf("after refused resolutions: %+v, %v; want still parked, untouched", a, err)
	}

	const reason = "PSP dashboard shows ch_3Nx charged once (OPS-2211)"
	if code, body := c.do(http.MethodPost, "/sideeffects/resolve", form("succeeded", reason, c.csrf), nil); code != http.StatusSeeOther {
		t.Fatalf("resolve: %d %s", code, body)
	}
	a, err := f.admin.Attempt(ctx, seName, key)
	if err != nil || a.State != sideeffect.Succeeded || a.Via != "operator" || a.Operator == nil || a.Operator.By != "console:token:alice" || a.Operator.Reason != reason {
		t.Fatalf("resolved attempt: %+v (operator %+v), %v; want succeeded by console:token:alice", a, a.Operator, err)
	}
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", form("failed", "again", c.csrf), nil); code != http.StatusConflict {
		t.Errorf("resolve of a settled attempt: %d, want 409", code)
	}
	key = f.unknown[0]
	if code, body := c.do(http.MethodPost, "/sideeffects/resolve", form("failed", "provider has no such charge", c.csrf), nil); code != http.StatusSeeOther {
		t.Fatalf("resolve an unknown attempt: %d %s", code, body)
	}
	if a, err := f.admin.Attempt(ctx, seName, key); err != nil || a.State != sideeffect.Failed {
		t.Fatalf("the unknown attempt after resolving it as failed: %+v, %v", a, err)
	}
	key = f.inFlight
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", form("failed", "x", c.csrf), nil); code != http.StatusConflict {
		t.Errorf("resolve of an attempt in flight: %d, want 409", code)
	}

	rows, err := f.pool.Query(ctx, `SELECT actor, reason, detail->>'key', detail->>'to' FROM `+f.schema+`.outbox_operations
WHERE action = 'sideeffect_resolve' ORDER BY operation_id`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for rows.Next() {
		var actor, reason, k, to string
		if err := rows.Scan(&actor, &reason, &k, &to); err != nil {
			t.Fatal(err)
		}
		audit = append(audit, actor+"|"+k+"|"+to+"|"+reason)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wantAudit := []string{"console:token:alice|" + f.parked[0] + "|succeeded|" + reason, "console:token:alice|" + f.unknown[0] + "|failed|provider has no such charge"}
	if strings.Join(audit, "\n") != strings.Join(wantAudit, "\n") {
		t.Fatalf("audit rows:\n%s\nwant:\n%s", strings.Join(audit, "\n"), strings.Join(wantAudit, "\n"))
	}
	_, body = c.get("/sideeffects?done=resolved&as=succeeded")
	if !strings.Contains(body, "Attempt resolved as succeeded") || !strings.Contains(body, `id="se-parked">2<`) {
		t.Fatalf("after resolving: no notice, or not 2 parked left:\n%s", body)
	}
}

var seNextRE = regexp.MustCompile(`href="(/sideeffects\?[^"]+)" id="next"`)

// TestSideEffectPagesWalkEveryAttemptOnce: with pages of 2, following the
// next-page links lists every parked attempt once, in order, and every
// open one likewise.
func TestSideEffectPagesWalkEveryAttemptOnce(t *testing.T) {
	t.Parallel()
	f := newSEFixture(t, 5, 3)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, PageSize: 2}))
	walk := func(path string) []string {
		var seen []string
		for pages := 0; path != ""; pages++ {
			if pages > 5 {
				t.Fatalf("more than 5 pages of 2 from %s", path)
			}
			code, body := c.get(path)
			if code != http.StatusOK {
				t.Fatalf("GET %s: %d\n%s", path, code, body)
			}
			seen = append(seen, keysOn(body)...)
			path = ""
			if m := seNextRE.FindStringSubmatch(body); m != nil {
				path = strings.ReplaceAll(m[1], "&amp;", "&")
			}
		}
		return seen
	}
	if got := walk("/sideeffects"); strings.Join(got, ",") != strings.Join(f.parked, ",") {
		t.Fatalf("parked pages list %v, want %v", got, f.parked)
	}
	want := append(append([]string(nil), f.unknown...), f.inFlight)
	if got := walk("/sideeffects?show=open"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("open pages list %v, want %v", got, want)
	}
	if got := walk("/sideeffects?show=parked&name=no.such.name"); len(got) != 0 {
		t.Fatalf("a name with no attempt lists %v", got)
	}
	for _, bad := range []string{"/sideeffects?show=everything", "/sideeffects?after=%FF", "/sideeffects?after=bm90IGpzb24"} {
		if code, _ := c.get(bad); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", bad, code)
		}
	}
}

// TestSideEffectsNotInstalled: a console whose side-effect schema has no
// side_effects table says so on the page and on the overview, and refuses
// a resolution with 404, instead of failing.
func TestSideEffectsNotInstalled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 0, 1)
	missing := outboxtest.UniqueName(t, "nose")
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, SideEffectSchema: missing, Token: testToken}))
	c.login("alice")
	code, body := c.get("/sideeffects")
	if code != http.StatusOK || !strings.Contains(body, `id="sideeffects-missing"`) || !strings.Contains(body, missing) {
		t.Fatalf("side-effect page without the table: %d\n%s", code, body)
	}
	code, body = c.get("/")
	if code != http.StatusOK || !strings.Contains(body, "no side_effects table in "+missing) {
		t.Fatalf("overview without the table: %d\n%s", code, body)
	}
	if code, _ := c.do(http.MethodPost, "/sideeffects/resolve", url.Values{"name": {seName}, "key": {"k"}, "as": {"failed"}, "reason": {"x"}, "csrf": {c.csrf}}, nil); code != http.StatusNotFound {
		t.Fatalf("resolve without the table: %d, want 404", code)
	}
}

// markupAggregate is the aggregate id of a waiting event: markup that must
// be shown escaped.
const markupAggregate = `ord-<b onmouseover="alert(1)">7</b>`

// addWaits records, for each key, that an event of consumer waits on the
// attempt of seName and that key (sideeffect.Caller.WaitTx), and returns
// the events' ids.
func addWaits(t testing.TB, pool *pgxpool.Pool, schema, consumer string, keys ...string) []string {
	t.Helper()
	ctx := context.Background()
	c, err := sideeffect.New(pool, sideeffect.Config{Name: seName, Schema: schema, Mode: sideeffect.Neither, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, key := range keys {
		id := uuid.Must(uuid.NewV7())
		msg := outbox.Message{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("ord-%04d", i), Sequence: int64(i + 1),
			Type: "PaymentRequested", SchemaVersion: 1, ContentType: "application/json", Payload: []byte(`{"amount_cents":1299}`)}
		if i == 0 {
			msg.AggregateID = markupAggregate
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return c.WaitTx(ctx, tx, sideeffect.Wait{Consumer: consumer, Key: key, Message: msg})
		}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id.String())
	}
	return ids
}

// TestSideEffectWaitsListed: the side-effect page counts the events waiting
// on a parked attempt (sideeffect.Caller.WaitTx) in a tile and the
// overview's card, and its Waiting tab lists them (event, aggregate,
// consumer, the attempt's name and key, since when), escaped, a page at a
// time: following the next-page links lists every one once, by consumer
// then event id; a name filter narrows them; a bad cursor is 400.
func TestSideEffectWaitsListed(t *testing.T) {
	t.Parallel()
	f := newSEFixture(t, 3, 1)
	ids := addWaits(t, f.pool, f.schema, "payments", f.parked[0], f.parked[1], f.parked[0])
	ids = append(ids, addWaits(t, f.pool, f.schema, "billing", f.parked[2], f.parked[2])...)
	want := slices.Clone(ids)
	slices.SortFunc(want, func(a, b string) int {
		ca, cb := "payments", "payments"
		if slices.Index(ids, a) >= 3 {
			ca = "billing"
		}
		if slices.Index(ids, b) >= 3 {
			cb = "billing"
		}
		return cmp.Or(cmp.Compare(ca, cb), cmp.Compare(a, b))
	})

	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken, PageSize: 2}))
	c.login("alice")
	_, body := c.get("/sideeffects")
	if !strings.Contains(body, `id="se-waiting">5<`) || !strings.Contains(body, `id="show-waiting"`) {
		t.Fatalf("the side-effect page does not count the 5 waiting events:\n%s", body)
	}
	if _, body = c.get("/"); !strings.Contains(body, `id="sideeffects-waiting">5 events waiting<`) {
		t.Fatalf("the overview's side-effect card does not count the 5 waiting events:\n%s", body)
	}

	var seen []string
	path := "/sideeffects?show=waiting"
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatalf("more than 3 pages of 2 from %s", path)
		}
		code, body := c.get(path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, body)
		}
		if pages == 0 {
			// The page lists waits, not attempts, each with the attempt it
			// waits on and since when.
			if len(keysOn(body)) != 0 || !strings.Contains(body, `class="mono small wait-key">`+f.parked[2]+`<`) ||
				!strings.Contains(body, "PaymentRequested") || !strings.Contains(body, ">billing<") || !strings.Contains(body, " ago<") {
				t.Fatalf("the first page of waits lacks its columns:\n%s", body)
			}
		}
		if strings.Contains(body, markupAggregate) {
			t.Fatalf("GET %s shows the aggregate id's markup unescaped", path)
		}
		seen = append(seen, eventsOn(body)...)
		path = ""
		if m := seNextRE.FindStringSubmatch(body); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Fatalf("the waiting pages list\n%v\nwant\n%v", seen, want)
	}
	_, body = c.get("/sideeffects?show=waiting&name=no.such.name")
	if got := eventsOn(body); len(got) != 0 || !strings.Contains(body, "No event waits on an attempt of that name") {
		t.Fatalf("a name with no attempt lists %v", got)
	}
	_, body = c.get("/sideeffects?show=waiting")
	if !strings.Contains(body, "ord-&lt;b onmouseover=&#34;alert(1)&#34;&gt;7&lt;/b&gt;") {
		t.Fatalf("the waiting event's aggregate id is not shown escaped:\n%s", body)
	}
	for _, bad := range []string{"/sideeffects?show=waiting&after=%FF", "/sideeffects?show=waiting&after=bm90IGpzb24",
		"/sideeffects?show=waiting&after=" + url.QueryEscape(base64.RawURLEncoding.EncodeToString([]byte(`{"consumer":"a","event_id":"not-a-uuid"}`)))} {
		if code, _ := c.get(bad); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", bad, code)
		}
	}
}

var waitRowRE = regexp.MustCompile(`<tr data-event="([0-9a-f-]{36})"`)

func eventsOn(body string) []string {
	var ids []string
	for _, m := range waitRowRE.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}
