package outboxconsole_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// chromium finds the browser: $OUTBOX_CHROMIUM, else chromium on the PATH.
// A missing browser fails the test (CI installs Debian's chromium).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OUTBOX_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium: install it (apt-get install -y --no-install-recommends chromium) or set OUTBOX_CHROMIUM")
	return ""
}

// browser starts a headless Chromium with the flags a closed network needs
// (without the background-networking ones it hangs on refused connections)
// and a fresh profile.
func browser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// screenshot saves the page as name in the test's artifact directory.
func screenshot(t *testing.T, ctx context.Context, dir, name string) []byte {
	t.Helper()
	outboxtest.Eventually(t, 30*time.Second, "the page loaded", func() bool {
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.readyState`))
		return err == nil && state == "complete"
	})
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	return png
}

// text returns the visible text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// waitNotice waits until the page (after the redirect of an action) shows
// a notice containing want. It polls, because the page before the action
// may show a notice of its own.
func waitNotice(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	js := `(document.querySelector("p.notice") || {textContent: ""}).textContent`
	outboxtest.Eventually(t, 30*time.Second, "notice "+want, func() bool {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		return err == nil && strings.Contains(got, want)
	})
}

// fetchStatus POSTs a form from the page (same origin, with its cookies,
// without a CSRF token) and returns the answer's status code.
func fetchStatus(t *testing.T, ctx context.Context, path, form string) int {
	t.Helper()
	js := `fetch(` + "`" + path + "`" + `, {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: ` + "`" + form + "`" + `}).then(r => r.status)`
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("fetch %s: %v", path, err)
	}
	return status
}

// TestConsoleInBrowser drives the console in a real headless Chromium
// against a real database with quarantined events: sent to the login page
// first (the pages need a login), it logs in, retries one
// event and skips another with a reason, checks the audit rows, finds the
// parked side-effect charges on the overview and resolves one on the
// side-effect page, lists the events waiting on them, resolves an inbox gap, checks that
// a POST without the CSRF token (logged in) or the session (logged out) is
// refused, finds an aggregate's lane and an event (whose payload's markup
// is shown as text), previews and confirms a bulk retry, and saves
// screenshots as test artifacts (go test -artifacts).
// With OUTBOX_CONSOLE_SCREENSHOT set, the overview's screenshot is also
// written there (how docs/img/console.png is made).
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 60, 4, 6)
	// One quarantined event was skipped before (by someone else), so that
	// the overview shows an operator action: its aggregate then drains.
	earlier := f.quarantined[3]
	f.quarantined = f.quarantined[:3]
	ev, err := f.admin.Event(context.Background(), earlier)
	if err != nil {
		t.Fatal(err)
	}
	f.refuse.Delete(ev.AggregateID)
	if _, err := f.admin.Skip(context.Background(), earlier, "console:token:bob", "duplicate capture, refunded in the PSP (OPS-1417)"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the skipped event's aggregate drained", func() bool {
		st, err := f.admin.Status(context.Background())
		return err == nil && st.Pending == 15 && st.Quarantined == 3
	})
	f.waitOnGap(t, "inventory", "ord-0007")
	f.waitOnGap(t, "inventory", "ord-0011")
	f.waitOnGap(t, "billing", "ord-0003")
	f.spreadPublished(t)
	// A consumer's charges: two parked for an operator, one unknown, one
	// in flight.
	se := addAttempts(t, f.pool, f.schema, 2, 1)
	// Two of the consumer's events wait on the parked charges.
	waits := addWaits(t, f.pool, f.schema, "payments", se.parked[0], se.parked[1])
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken, Refresh: -1})
	dir := t.ArtifactDir()
	t.Logf("screenshots in %s", dir)
	ctx := browser(t, 2*time.Minute)

	// The pages need a login: the overview sends the browser to the login
	// page, where a POST is refused for want of a session.
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#token`))); err != nil {
		t.Fatalf("overview before logging in: %v", err)
	}
	if s := fetchStatus(t, ctx, "/quarantine/retry", "event_id="+f.quarantined[0].String()); s != 401 {
		t.Fatalf("POST retry without logging in: %d, want 401", s)
	}
	screenshot(t, ctx, dir, "login.png")
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`#name`), "alice"),
		chromedp.SendKeys(chromedp.CSS(`#token`), testToken),
		chromedp.Click(chromedp.CSS(`#login`)),
		chromedp.WaitVisible(chromedp.CSS(`table.quarantine`)),
	); err != nil {
		t.Fatalf("log in: %v", err)
	}
	screenshot(t, ctx, dir, "quarantine.png")

	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#backlog`))); err != nil {
		t.Fatalf("overview: %v", err)
	}
	quarantined, backlog := text(t, ctx, "#quarantined"), text(t, ctx, "#backlog")
	if quarantined != "3" || backlog != "15" {
		t.Fatalf("overview shows %s quarantined and %s pending; want 3 and 15", quarantined, backlog)
	}
	if stuck := text(t, ctx, "#sideeffects-stuck"); stuck != "3" {
		t.Fatalf("overview shows %s side-effect attempts stuck; want 3 (2 parked, 1 unknown)", stuck)
	}
	if alert := text(t, ctx, "#sideeffects-alert"); !strings.Contains(alert, "2 parked") {
		t.Fatalf("the overview's alert says %q", alert)
	}
	if w := text(t, ctx, "#sideeffects-waiting"); w != "2 events waiting" {
		t.Fatalf("the overview's side-effect card says %q, want 2 events waiting", w)
	}
	for _, id := range []string{"#chart-failed", "#chart-backlog", "#chart-latency"} {
		if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(id+" svg"))); err != nil {
			t.Fatalf("chart %s: %v", id, err)
		}
	}
	png := screenshot(t, ctx, dir, "overview.png")
	if out := os.Getenv("OUTBOX_CONSOLE_SCREENSHOT"); out != "" {
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/quarantine"), chromedp.WaitVisible(chromedp.CSS(`table.quarantine`))); err != nil {
		t.Fatalf("quarantine page: %v", err)
	}

	// Logged in, a POST without the form's CSRF token is refused.
	if s := fetchStatus(t, ctx, "/quarantine/retry", "event_id="+f.quarantined[0].String()); s != 403 {
		t.Fatalf("POST retry without the CSRF token: %d, want 403", s)
	}

	retried, skipped := f.quarantined[0], f.quarantined[1]
	ev, err = f.admin.Event(context.Background(), retried)
	if err != nil {
		t.Fatal(err)
	}
	f.refuse.Delete(ev.AggregateID) // the destination accepts it now
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-event="`+retried.String()+`"] button.retry`))); err != nil {
		t.Fatalf("retry: %v", err)
	}
	waitNotice(t, ctx, "Event "+retried.String()+" retried")
	const reason = "merchant will never accept EUR; refunded by hand (ticket OPS-1432)"
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`tr[data-event="`+skipped.String()+`"] input.reason`), reason),
		chromedp.Click(chromedp.CSS(`tr[data-event="`+skipped.String()+`"] button.skip`)),
	); err != nil {
		t.Fatalf("skip: %v", err)
	}
	waitNotice(t, ctx, "Event "+skipped.String()+" skipped")
	screenshot(t, ctx, dir, "after-actions.png")
	checkAudit(t, f, "console:token:alice", retried, skipped, reason)

	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/operations"), chromedp.WaitVisible(chromedp.CSS(`table.operations`))); err != nil {
		t.Fatalf("operations page: %v", err)
	}
	ops := text(t, ctx, "table.operations")
	if !strings.Contains(ops, "console:token:alice") || !strings.Contains(ops, "OPS-1432") {
		t.Fatalf("the operations page does not show the actions:\n%s", ops)
	}
	screenshot(t, ctx, dir, "operations.png")

	// Find: the last quarantined event's aggregate, its lane and its
	// events; then the event's page, whose payload holds markup shown as
	// text (the page runs no script of the payload's: a dialog would
	// block the next action).
	third, err := f.admin.Event(context.Background(), f.quarantined[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/events"), chromedp.WaitVisible(chromedp.CSS(`#find-aggregate`)),
		chromedp.SendKeys(chromedp.CSS(`#find-aggregate input[name=aggregate_type]`), "payment"),
		chromedp.SendKeys(chromedp.CSS(`#find-aggregate input[name=aggregate_id]`), third.AggregateID),
		chromedp.Click(chromedp.CSS(`#find-aggregate button`)),
		chromedp.WaitVisible(chromedp.CSS(`#lane`)),
	); err != nil {
		t.Fatalf("find the aggregate: %v", err)
	}
	if q := text(t, ctx, "#lane-quarantined"); q != "1" {
		t.Fatalf("the lane of %s shows %s quarantined, want 1", third.AggregateID, q)
	}
	screenshot(t, ctx, dir, "find-lane.png")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-event="`+third.ID.String()+`"] a.mono`)), chromedp.WaitVisible(chromedp.CSS(`#payload`))); err != nil {
		t.Fatalf("the event's page: %v", err)
	}
	if p := text(t, ctx, "#payload"); !strings.Contains(p, "<script>alert('x')</script>") {
		t.Fatalf("the payload is not shown as text: %q", p)
	}
	if st := text(t, ctx, "#state"); st != "quarantined" {
		t.Fatalf("the event's state: %q, want quarantined", st)
	}
	screenshot(t, ctx, dir, "event.png")

	// Bulk: preview a retry of every event refused for the currency, then
	// confirm it. The skipped event's aggregate went on, and its next event
	// was refused in turn: two are quarantined once the relay is done.
	outboxtest.Eventually(t, 30*time.Second, "the skipped aggregate's next event quarantined", func() bool {
		st, err := f.admin.Status(context.Background())
		return err == nil && st.Quarantined == 2 && st.Leased == 0
	})
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/quarantine"), chromedp.WaitVisible(chromedp.CSS(`#bulk`)),
		chromedp.SendKeys(chromedp.CSS(`#bulk input[name=error]`), "currency EUR"),
		chromedp.Click(chromedp.CSS(`#bulk-retry`)),
		chromedp.WaitVisible(chromedp.CSS(`#bulk-confirm`)),
	); err != nil {
		t.Fatalf("bulk preview: %v", err)
	}
	if n := text(t, ctx, "#bulk-n"); n != "2" {
		t.Fatalf("the bulk preview covers %s events, want the 2 quarantined", n)
	}
	screenshot(t, ctx, dir, "bulk-preview.png")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#bulk-apply`)), chromedp.WaitVisible(chromedp.CSS(`#bulk-result`))); err != nil {
		t.Fatalf("bulk confirm: %v", err)
	}
	if r := text(t, ctx, "#bulk-result"); !strings.HasPrefix(r, "2 retried, 0 refused") {
		t.Fatalf("bulk result: %q", r)
	}
	screenshot(t, ctx, dir, "bulk-done.png")

	// The side effects: the parked charges, one resolved as succeeded with
	// a reason; then the unknown and in-flight ones.
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/sideeffects"), chromedp.WaitVisible(chromedp.CSS(`table.sideeffects`))); err != nil {
		t.Fatalf("side-effect page: %v", err)
	}
	if p := text(t, ctx, "#se-parked"); p != "2" {
		t.Fatalf("side-effect page shows %s parked, want 2", p)
	}
	screenshot(t, ctx, dir, "sideeffects.png")
	resolved := se.parked[0]
	row := `tr[data-key="` + resolved + `"]`
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('`+row+` select.as').value = "succeeded"`)); err != nil {
		t.Fatalf("choose succeeded: %v", err)
	}
	const seReason = "PSP shows the charge captured once (OPS-2290)"
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(row+` input.reason`), seReason),
		chromedp.Click(chromedp.CSS(row+` button.resolve`)),
	); err != nil {
		t.Fatalf("resolve: %v", err)
	}
	waitNotice(t, ctx, "Attempt resolved as succeeded")
	if a, err := se.admin.Attempt(context.Background(), seName, resolved); err != nil || a.State != "succeeded" || a.Operator == nil || a.Operator.By != "console:token:alice" || a.Operator.Reason != seReason {
		t.Fatalf("the resolved attempt: %+v, %v", a, err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/sideeffects?show=open"), chromedp.WaitVisible(chromedp.CSS(`table.sideeffects`))); err != nil {
		t.Fatalf("side-effect page, open attempts: %v", err)
	}
	screenshot(t, ctx, dir, "sideeffects-open.png")
	// The events waiting on the parked charges, the first one's aggregate
	// id markup shown as text.
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/sideeffects?show=waiting"), chromedp.WaitVisible(chromedp.CSS(`table.waits`))); err != nil {
		t.Fatalf("side-effect page, waiting events: %v", err)
	}
	if w := text(t, ctx, "#se-waiting"); w != "2" {
		t.Fatalf("side-effect page counts %s waiting events, want 2", w)
	}
	for i, id := range waits {
		r := text(t, ctx, `tr[data-event="`+id+`"]`)
		if !strings.Contains(r, se.parked[i]) || !strings.Contains(r, "payments") || !strings.Contains(r, "PaymentRequested") || !strings.Contains(r, " ago") {
			t.Fatalf("the waiting event %s's row says %q; want the key it waits on, its consumer, type and age", id, r)
		}
	}
	if r := text(t, ctx, `tr[data-event="`+waits[0]+`"]`); !strings.Contains(r, markupAggregate) {
		t.Fatalf("the waiting event's aggregate id is not shown as text: %q", r)
	}
	screenshot(t, ctx, dir, "sideeffects-waiting.png")
	if s := fetchStatus(t, ctx, "/sideeffects/resolve", "name="+seName+"&key="+se.unknown[0]+"&as=failed&reason=x"); s != 403 {
		t.Fatalf("POST resolve without the CSRF token: %d, want 403", s)
	}

	// The inbox: resolve a waiting aggregate's gap.
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/inbox"), chromedp.WaitVisible(chromedp.CSS(`tr[data-aggregate="order/ord-0007"][data-consumer="inventory"]`))); err != nil {
		t.Fatalf("inbox page: %v", err)
	}
	screenshot(t, ctx, dir, "inbox.png")
	gap := `tr[data-aggregate="order/ord-0007"][data-consumer="inventory"]`
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(gap+` input.reason`), "event #1 lost with the broker's disk (INC-88)"),
		chromedp.Click(chromedp.CSS(gap+` button.resolve`)),
	); err != nil {
		t.Fatalf("inbox resolve: %v", err)
	}
	waitNotice(t, ctx, "Gap resolved")
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/operations"), chromedp.WaitVisible(chromedp.CSS(`table.operations`))); err != nil {
		t.Fatalf("operations page: %v", err)
	}
	ops = text(t, ctx, "table.operations")
	if !strings.Contains(ops, "sideeffect_resolve") || !strings.Contains(ops, "inbox_resolve") || !strings.Contains(ops, "OPS-2290") {
		t.Fatalf("the operations page does not show the resolutions:\n%s", ops)
	}
	screenshot(t, ctx, dir, "operations-after-resolve.png")

	// Logged out again: back on the login page, and refused for want of a
	// session.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`button.link`)), chromedp.WaitVisible(chromedp.CSS(`#token`))); err != nil {
		t.Fatalf("log out: %v", err)
	}
	if s := fetchStatus(t, ctx, "/quarantine/skip", "event_id="+f.quarantined[2].String()+"&reason=x"); s != 401 {
		t.Fatalf("POST skip after logging out: %d, want 401", s)
	}
}

// TestConsoleRefreshesItself: the overview reloads itself (the embedded
// script, allowed by the page's Content-Security-Policy) and so shows a
// skip made elsewhere without anyone navigating.
func TestConsoleRefreshesItself(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1, 2)
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Refresh: time.Second})
	ctx := browser(t, time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#quarantined`))); err != nil {
		t.Fatalf("overview: %v", err)
	}
	if q := text(t, ctx, "#quarantined"); q != "1" {
		t.Fatalf("overview shows %s quarantined, want 1", q)
	}
	f.refuse.Delete("pay-0000") // or the event behind the skipped one is quarantined in turn
	if _, err := f.admin.Skip(context.Background(), f.quarantined[0], "cli:carol", "done elsewhere"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the overview shows the skip by itself", func() bool {
		q, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("quarantined") || {textContent: ""}).textContent`))
		return err == nil && q == "0"
	})
}
