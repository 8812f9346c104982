package outboxconsole_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="(\w+)" value="([^"]*)">`)

// confirmForm reads the confirm form of a bulk preview page.
func confirmForm(t *testing.T, body string) url.Values {
	t.Helper()
	i := strings.Index(body, `id="bulk-confirm"`)
	if i < 0 {
		t.Fatalf("the preview has no confirm form:\n%s", body)
	}
	form := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(body[i:], -1) {
		form.Set(m[1], html.UnescapeString(m[2]))
	}
	return form
}

// operationsOf returns the audit rows (action, actor, event) of the schema,
// oldest first.
func operationsOf(t *testing.T, f *fixture) []outbox.Operation {
	t.Helper()
	ops, err := f.admin.Operations(context.Background(), outbox.OperationFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(ops)
	return ops
}

// TestBulkRetryAppliesExactlyThePreview: a bulk retry by error text
// previews the matching quarantined events, then retries exactly those,
// one audit row each; an event quarantined after the preview, although it
// matches, is not touched.
func TestBulkRetryAppliesExactlyThePreview(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 1, 4, 2)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	c.login("alice")
	code, body := c.get("/quarantine/bulk?action=retry&error=CURRENCY+eur")
	if code != http.StatusOK || !strings.Contains(body, `<b id="bulk-n">4</b>`) {
		t.Fatalf("preview: %d, not 4 events:\n%s", code, body)
	}
	for _, id := range f.quarantined {
		if !strings.Contains(body, `data-event="`+id.String()+`"`) {
			t.Fatalf("the preview does not list %s:\n%s", id, body)
		}
	}
	form := confirmForm(t, body)

	// A payment refused the same way, quarantined after the preview.
	f.refuse.Store("pay-late", true)
	late := writeEvent(t, f, outbox.Event{AggregateType: "payment", AggregateID: "pay-late", Type: "PaymentCaptured", Payload: []byte(`{}`)})
	var lateAt time.Time
	outboxtest.Eventually(t, 30*time.Second, "the late payment quarantined", func() bool {
		e, err := f.admin.Event(ctx, late)
		if err == nil && e.QuarantinedAt != nil {
			lateAt = *e.QuarantinedAt
		}
		return err == nil && e.State() == "quarantined"
	})
	for _, id := range []string{"pay-0000", "pay-0001", "pay-0002", "pay-0003"} {
		f.refuse.Delete(id) // the destination takes the previewed ones now
	}

	code, body = c.do(http.MethodPost, "/quarantine/bulk", form, nil)
	if code != http.StatusOK || !strings.Contains(body, `<b>4</b> retried, <b>0</b> refused`) {
		t.Fatalf("bulk retry: %d\n%s", code, body)
	}
	ops := operationsOf(t, f)
	var got []uuid.UUID
	for _, o := range ops {
		if o.Action != "retry" || o.Actor != "console:token:alice" || o.EventID == nil {
			t.Fatalf("audit row %+v, want retries by console:token:alice", o)
		}
		got = append(got, *o.EventID)
	}
	slices.SortFunc(got, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	want := slices.Clone(f.quarantined)
	slices.SortFunc(want, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	if !slices.Equal(got, want) {
		t.Fatalf("audit rows for %v, want one for each previewed event %v", got, want)
	}
	e, err := f.admin.Event(ctx, late)
	if err != nil || e.State() != "quarantined" || !e.QuarantinedAt.Equal(lateAt) {
		t.Fatalf("the event quarantined after the preview: %+v, %v; want untouched", e, err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the retried events published", func() bool {
		st, err := f.admin.Status(ctx)
		return err == nil && st.Quarantined == 1 && st.Pending == 0
	})
}

// TestBulkRefusedWhenChangedTamperedOrUnauthorised: a confirm is refused
// without a session (401) or its CSRF token (403), with a form widened or
// signed for another session (403), a skip without a reason (400); and
// when the previewed events changed (one retried elsewhere), nothing is
// done and the new preview is shown (409). A read-only console previews
// without a confirm form. None of it writes an audit row.
func TestBulkRefusedWhenChangedTamperedOrUnauthorised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 0, 3, 2)
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken})
	alice, bob, anon := newClient(t, srv), newClient(t, srv), newClient(t, srv)
	alice.login("alice")
	bob.login("bob")
	_, body := alice.get("/quarantine/bulk?action=skip&event_type=PaymentCaptured")
	form := confirmForm(t, body)
	form.Set("reason", "refunded by hand (OPS-7)")
	if form.Get("n") != "3" {
		t.Fatalf("preview of 3 events carries n=%s", form.Get("n"))
	}
	_, bobBody := bob.get("/quarantine/bulk?action=skip&event_type=PaymentCaptured")
	bobs := confirmForm(t, bobBody)

	with := func(k, v string) url.Values {
		g := url.Values{}
		for key, vs := range form {
			g[key] = slices.Clone(vs)
		}
		if v == "" {
			g.Del(k)
		} else {
			g.Set(k, v)
		}
		return g
	}
	cases := []struct {
		name string
		c    *client
		form url.Values
		want int
	}{
		{"without a session", anon, form, 401},
		{"without the CSRF token", alice, with("csrf", ""), 403},
		{"bound widened", alice, with("through", "2999-01-01T00:00:00Z_ffffffff-ffff-ffff-ffff-ffffffffffff"), 403},
		{"count changed", alice, with("n", "2"), 403},
		{"another filter", alice, with("event_type", "OrderCreated"), 403},
		{"bob's preview", alice, with("sig", bobs.Get("sig")), 403},
		{"no signature", alice, with("sig", ""), 403},
		{"skip without a reason", alice, with("reason", ""), 400},
	}
	for _, tc := range cases {
		if code, body := tc.c.do(http.MethodPost, "/quarantine/bulk", tc.form, nil); code != tc.want {
			t.Errorf("%s: %d, want %d\n%s", tc.name, code, tc.want, body)
		}
	}
	if ops := operationsOf(t, f); len(ops) != 0 {
		t.Fatalf("refused confirms wrote audit rows: %+v", ops)
	}

	// One of the previewed events is retried elsewhere (and quarantined
	// again by the relay, after the preview): the set changed.
	if _, err := f.admin.Retry(ctx, f.quarantined[0], "cli:carol"); err != nil {
		t.Fatal(err)
	}
	code, body := alice.do(http.MethodPost, "/quarantine/bulk", form, nil)
	if code != http.StatusConflict || !strings.Contains(body, "Nothing was done") || !strings.Contains(body, `id="bulk-confirm"`) {
		t.Fatalf("confirm after a change: %d, want 409 with a new preview\n%s", code, body)
	}
	if ops := operationsOf(t, f); len(ops) != 1 || ops[0].Actor != "cli:carol" {
		t.Fatalf("after the refused confirm the audit log is %+v; want carol's retry only", ops)
	}

	ro := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken, ReadOnly: true}))
	ro.login("alice")
	if code, body := ro.get("/quarantine/bulk?action=skip&event_type=PaymentCaptured"); code != http.StatusOK || strings.Contains(body, `id="bulk-confirm"`) || !strings.Contains(body, `id="bulk-n"`) {
		t.Fatalf("read-only preview: %d, want the count without a confirm form\n%s", code, body)
	}
	if code, _ := alice.get("/quarantine/bulk?action=skip"); code != http.StatusBadRequest {
		t.Fatalf("a preview of every quarantined event: %d, want 400", code)
	}
}

// TestBulkSkipKeepsTheLaneRule: a bulk skip goes through Admin.SkipSeen:
// of two quarantined events of one aggregate with a pending one between
// them, the head is skipped and the later one refused (an earlier event is
// not settled), and listed as refused; one audit row, for the head.
func TestBulkSkipKeepsTheLaneRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 0, 1, 3)
	head := f.quarantined[0]
	var third uuid.UUID
	if err := f.pool.QueryRow(ctx, `UPDATE `+f.schema+`.outbox_events
SET quarantined_at = now(), attempt_count = 1, last_error = 'permanent: 422 from payments: currency EUR not enabled'
WHERE aggregate_id = 'pay-0000' AND aggregate_sequence = 3 RETURNING event_id`).Scan(&third); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken}))
	c.login("alice")
	_, body := c.get("/quarantine/bulk?action=skip&error=not+enabled")
	form := confirmForm(t, body)
	if form.Get("n") != "2" {
		t.Fatalf("preview: n=%s, want 2\n%s", form.Get("n"), body)
	}
	form.Set("reason", "merchant closed")
	code, body := c.do(http.MethodPost, "/quarantine/bulk", form, nil)
	if code != http.StatusOK || !strings.Contains(body, `<b>1</b> skipped, <b>1</b> refused`) ||
		!strings.Contains(body, `data-event="`+third.String()+`"`) || !strings.Contains(body, "not settled") {
		t.Fatalf("bulk skip: %d, want the head skipped and #3 refused\n%s", code, body)
	}
	ops := operationsOf(t, f)
	if len(ops) != 1 || ops[0].Action != "skip" || *ops[0].EventID != head || ops[0].Reason != "merchant closed" {
		t.Fatalf("audit log %+v; want one skip of the head %s", ops, head)
	}
	if e, err := f.admin.Event(ctx, third); err != nil || e.State() != "quarantined" {
		t.Fatalf("#3 after the bulk skip: %+v, %v; want still quarantined", e, err)
	}
}
