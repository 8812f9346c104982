package outboxconsole_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// TestInboxResolveFromConsole: the inbox page offers to resolve a waiting
// aggregate's gap, as `outbox inbox resolve` does; refused without a
// session or the CSRF token and without a reason; otherwise the mark moves
// just below the lowest sequence seen, the wait ends, and the audit log has
// it by console:token:<name>; a second resolution is a conflict.
func TestInboxResolveFromConsole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 0, 1)
	f.waitOnGap(t, "inventory", "ord-0042")
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken})
	c := newClient(t, srv)
	c.login("carol")
	_, body := c.get("/inbox")
	if !strings.Contains(body, `action="/inbox/resolve"`) || !strings.Contains(body, `data-aggregate="order/ord-0042"`) {
		t.Fatalf("the inbox page offers no resolution of the waiting aggregate:\n%s", body)
	}
	form := func(reason, csrf string) url.Values {
		return url.Values{"consumer": {"inventory"}, "aggregate_type": {"order"}, "aggregate_id": {"ord-0042"}, "reason": {reason}, "csrf": {csrf}}
	}
	if code, _ := newClient(t, srv).do(http.MethodPost, "/inbox/resolve", form("lost", ""), nil); code != http.StatusUnauthorized {
		t.Errorf("resolve without a session: %d, want 401", code)
	}
	if code, _ := c.do(http.MethodPost, "/inbox/resolve", form("lost", ""), nil); code != http.StatusForbidden {
		t.Errorf("resolve without the CSRF token: %d, want 403", code)
	}
	if code, _ := c.do(http.MethodPost, "/inbox/resolve", form(" ", c.csrf), nil); code != http.StatusBadRequest {
		t.Errorf("resolve without a reason: %d, want 400", code)
	}
	admin, err := inbox.NewAdmin(f.pool, inbox.AdminConfig{Schema: f.schema})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := admin.Aggregate(ctx, "inventory", "order", "ord-0042"); err != nil || a.Wait == nil || a.LastSequence != 0 {
		t.Fatalf("after refused resolutions: %+v, %v; want still waiting at mark 0", a, err)
	}
	const reason = "event #1 lost in the broker's disk failure (INC-88)"
	if code, body := c.do(http.MethodPost, "/inbox/resolve", form(reason, c.csrf), nil); code != http.StatusSeeOther {
		t.Fatalf("resolve: %d %s", code, body)
	}
	a, err := admin.Aggregate(ctx, "inventory", "order", "ord-0042")
	if err != nil || a.Wait != nil || a.LastSequence != 1 || a.Start == nil || a.Start.By != "console:token:carol" {
		t.Fatalf("after resolving: %+v (start %+v), %v; want mark 1, no wait, by console:token:carol", a, a.Start, err)
	}
	var actor, got string
	if err := f.pool.QueryRow(ctx, `SELECT actor, reason FROM `+f.schema+`.outbox_operations WHERE action = 'inbox_resolve'`).Scan(&actor, &got); err != nil || actor != "console:token:carol" || got != reason {
		t.Fatalf("audit row: %q %q, %v", actor, got, err)
	}
	if code, _ := c.do(http.MethodPost, "/inbox/resolve", form("again", c.csrf), nil); code != http.StatusConflict {
		t.Errorf("resolve of an aggregate no longer waiting: %d, want 409", code)
	}
	if _, body := c.get("/inbox?done=inbox-resolved"); !strings.Contains(body, "Gap resolved") {
		t.Error("no notice after resolving")
	}
}
