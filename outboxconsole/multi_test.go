package outboxconsole_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// silentServer accepts connections and never answers: a database that
// hangs.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

var linkRE = regexp.MustCompile(`(?:href|action|src)="(/[^"]*)"`)

// TestMultiConsole: NewMulti's index lists each source with its figures and
// a source whose database hangs as down, within FiguresTimeout and without
// the URL's password; every page of a source keeps its links, forms and
// paging under the source's prefix; one login serves every source, and an
// action lands in its source's schema only.
func TestMultiConsole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 2, 2, 3) // 2 quarantined, 4 parked behind them
	f.waitOnGap(t, "billing", "ord-0000")
	pool2, other := outboxtest.Schema(t)
	hung, err := pgxpool.New(ctx, "postgres://outbox:s3cretHungPw@"+silentServer(t)+"/x?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hung.Close)
	sources := func(context.Context) []outboxconsole.Source {
		return []outboxconsole.Source{
			{Database: "main", Schema: f.schema, Pool: f.pool},
			{Database: "main", Schema: other, Pool: pool2},
			{Database: "hung", Schema: "outbox", Pool: hung},
		}
	}
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Sources: sources, Token: testToken, Logger: discard(),
		FiguresTimeout: 500 * time.Millisecond, PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	base := "/sources/main/" + f.schema

	// Before the login: nothing but the login page.
	for _, p := range []string{"/", base + "/", base + "/quarantine", base + "/static/console.css"} {
		if code, _ := c.get(p); code != http.StatusSeeOther {
			t.Errorf("GET %s without a login: %d, want 303 to /login", p, code)
		}
	}
	if code, _ := c.get("/static/console.css"); code != http.StatusOK {
		t.Errorf("GET /static/console.css: %d", code)
	}
	c.login("bob")

	start := time.Now()
	code, body := c.get("/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the index took %s with a hung database, want about FiguresTimeout", took)
	}
	for src, want := range map[string][]string{
		"main/" + f.schema: {`data-figure="pending">4<`, `data-figure="quarantined">2<`, `data-figure="relays">1<`},
		"main/" + other:    {`data-figure="pending">0<`, `data-figure="quarantined">0<`, `data-figure="relays">0<`},
		"hung/outbox":      {`<span class="state down">down</span>`},
	} {
		row := regexp.MustCompile(`(?s)data-source="` + regexp.QuoteMeta(src) + `">(.*?)</tr>`).FindStringSubmatch(body)
		if row == nil {
			t.Errorf("index: no row for %s", src)
			continue
		}
		for _, w := range want {
			if !strings.Contains(row[1], w) {
				t.Errorf("index, %s: no %s in\n%s", src, w, row[1])
			}
		}
	}
	if strings.Contains(body, "s3cretHungPw") {
		t.Error("the index shows a database password")
	}

	// Every page of the source: its links stay under its prefix (or go to
	// the index, the login, the static files). PageSize 1 makes the lists
	// page, so the paging links are checked too.
	for _, p := range []string{"/", "/quarantine", "/inbox", "/inbox?consumer=billing", "/operations", "/sideeffects", "/events",
		"/events?aggregate_type=payment&aggregate_id=pay-0000", "/events/" + f.quarantined[0].String(),
		"/quarantine/bulk?action=retry&event_type=PaymentCaptured"} {
		code, body := c.get(base + p)
		if code != http.StatusOK {
			t.Errorf("GET %s%s: %d\n%s", base, p, code, body)
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(body, -1) {
			u := m[1]
			if !strings.HasPrefix(u, base+"/") && u != "/" && u != "/login" && u != "/logout" && !strings.HasPrefix(u, "/static/") {
				t.Errorf("GET %s%s: a link or form leaves the source's prefix: %s", base, p, u)
			}
		}
		if p == "/quarantine" && !strings.Contains(body, `id="next"`) {
			t.Errorf("the quarantine page of one row has no next page link")
		}
	}

	// An action under the prefix, with the console's one session and CSRF
	// token: it lands in this source's schema only.
	code, body = c.do(http.MethodPost, base+"/quarantine/retry", url.Values{"event_id": {f.quarantined[0].String()}, "csrf": {c.csrf}}, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("retry: %d %s", code, body)
	}
	var n int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.schema+".outbox_operations WHERE action = 'retry' AND actor = 'console:token:bob'").Scan(&n); err != nil || n != 1 {
		t.Errorf("retries by bob in %s: %d, %v; want 1", f.schema, n, err)
	}
	if err := pool2.QueryRow(ctx, "SELECT count(*) FROM "+other+".outbox_operations").Scan(&n); err != nil || n != 0 {
		t.Errorf("operations in %s: %d, %v; want none", other, n, err)
	}
	// The hung source's pages are served, and fail, without holding the
	// console: the index still answers.
	if code, _ := c.get("/sources/nowhere/outbox/"); code != http.StatusNotFound {
		t.Errorf("GET a source not listed: %d, want 404", code)
	}
}

// TestMultiConsoleHostChecked: a source's pages answer only the console's
// hosts, as New's do.
func TestMultiConsoleHostChecked(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Logger: discard(), PublicRead: true, Token: testToken,
		Sources: func(context.Context) []outboxconsole.Source {
			return []outboxconsole.Source{{Database: "main", Schema: schema, Pool: pool}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newClient(t, srv)
	for _, p := range []string{"/", "/sources/main/" + schema + "/", "/sources/main/" + schema + "/quarantine"} {
		if code := c.doHost(http.MethodGet, p, "attacker.example", nil); code != http.StatusMisdirectedRequest {
			t.Errorf("GET %s for another host: %d, want 421", p, code)
		}
		if code, body := c.get(p); code != http.StatusOK {
			t.Errorf("GET %s (public read): %d\n%s", p, code, body)
		}
	}
	// Public pages, but actions still need the login.
	if code, _ := c.do(http.MethodPost, "/sources/main/"+schema+"/quarantine/skip", url.Values{"event_id": {"x"}}, nil); code != http.StatusUnauthorized {
		t.Errorf("skip without a login: %d, want 401", code)
	}
}

// TestMultiConsoleInBrowser drives NewMulti in a headless Chromium: the
// login at the root leads to the index, whose link opens a source's
// console; its navigation, stylesheet and retry form work under the
// source's prefix, the retry lands in that source's schema, and "all
// sources" leads back to the index.
func TestMultiConsoleInBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 2, 3)
	pool2, other := outboxtest.Schema(t)
	h, err := outboxconsole.NewMulti(outboxconsole.MultiConfig{Token: testToken, Logger: discard(), Refresh: -1,
		Sources: func(context.Context) []outboxconsole.Source {
			return []outboxconsole.Source{{Database: "main", Schema: f.schema, Pool: f.pool}, {Database: "main", Schema: other, Pool: pool2}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	base := "/sources/main/" + f.schema
	ctx := browser(t, 2*time.Minute)
	path := func() string {
		t.Helper()
		p, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.pathname`))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+base+"/quarantine"), chromedp.WaitVisible(chromedp.CSS(`#token`))); err != nil {
		t.Fatalf("a source's page before logging in: %v", err)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`#name`), "carol"),
		chromedp.SendKeys(chromedp.CSS(`#token`), testToken),
		chromedp.Click(chromedp.CSS(`#login`)),
		chromedp.WaitVisible(chromedp.CSS(`table#sources`)),
	); err != nil {
		t.Fatalf("log in: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-source="main/`+f.schema+`"] a`)), chromedp.WaitVisible(chromedp.CSS(`#backlog`))); err != nil {
		t.Fatalf("open the source from the index: %v", err)
	}
	if p := path(); p != base+"/" {
		t.Errorf("the source's overview is at %s, want %s/", p, base)
	}
	if q := text(t, ctx, "#quarantined"); q != "2" {
		t.Errorf("the source's overview shows %s quarantined, want 2", q)
	}
	styled, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.styleSheets.length > 0 && document.styleSheets[0].cssRules.length > 0`))
	if err != nil || !styled {
		t.Errorf("the source's page has no stylesheet: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`nav a[href$="/quarantine"]`)), chromedp.WaitVisible(chromedp.CSS(`table.quarantine`))); err != nil {
		t.Fatalf("the source's quarantine page from its navigation: %v", err)
	}
	if p := path(); p != base+"/quarantine" {
		t.Errorf("the quarantine page is at %s, want %s/quarantine", p, base)
	}
	retried := f.quarantined[0]
	ev, err := f.admin.Event(context.Background(), retried)
	if err != nil {
		t.Fatal(err)
	}
	f.refuse.Delete(ev.AggregateID)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-event="`+retried.String()+`"] button.retry`))); err != nil {
		t.Fatalf("retry: %v", err)
	}
	waitNotice(t, ctx, "Event "+retried.String()+" retried")
	if p := path(); p != base+"/quarantine" {
		t.Errorf("after the retry the browser is at %s, want %s/quarantine", p, base)
	}
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.schema+".outbox_operations WHERE action = 'retry' AND actor = 'console:token:carol' AND event_id = $1", retried).Scan(&n); err != nil || n != 1 {
		t.Errorf("carol's retry in %s: %d rows, %v; want 1", f.schema, n, err)
	}
	if err := pool2.QueryRow(context.Background(), "SELECT count(*) FROM "+other+".outbox_operations").Scan(&n); err != nil || n != 0 {
		t.Errorf("operations in %s: %d, %v; want none", other, n, err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#all-sources`)), chromedp.WaitVisible(chromedp.CSS(`table#sources`))); err != nil {
		t.Fatalf("back to the index: %v", err)
	}
}
