package outboxconsole_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// hostilePayload is a payload that would run script if it were rendered as
// HTML, or sniffed as HTML from a download.
const hostilePayload = `{"note":"<script>alert(1)</script><img src=x onerror=alert(2)>","total":1}`

// writeHostile writes one event with hostile headers and payload (of an
// aggregate the fixture's destination accepts) and returns its id.
func writeHostile(t *testing.T, f *fixture) uuid.UUID {
	t.Helper()
	return writeEvent(t, f, outbox.Event{AggregateType: "note", AggregateID: "n-1", Type: "NoteAdded", Payload: []byte(hostilePayload),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-label": "<b onmouseover=alert(3)>hi</b>"}})
}

// writeEvent writes one event and returns its id.
func writeEvent(t *testing.T, f *fixture, ev outbox.Event) uuid.UUID {
	t.Helper()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: f.schema})
	if err != nil {
		t.Fatal(err)
	}
	var recs []outbox.Recorded
	if err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		recs, err = w.InsertTx(context.Background(), tx, ev)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return recs[0].ID
}

// location returns the Location of a redirect.
func (c *client) location(path string) (int, string) {
	c.t.Helper()
	resp, err := c.http.Get(c.srv.URL + path)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

var eventLinkRE = regexp.MustCompile(`<tr data-event="([0-9a-f-]{36})"`)
var findNextRE = regexp.MustCompile(`href="(/events\?[^"]+)" id="next"`)

// walk follows the next-page links from path and returns the events listed,
// in order, and the number of pages.
func (c *client) walk(path string, maxPages int) ([]string, int) {
	c.t.Helper()
	var seen []string
	pages := 0
	for ; path != ""; pages++ {
		if pages == maxPages {
			c.t.Fatalf("more than %d pages from %s", maxPages, path)
		}
		code, body := c.get(path)
		if code != http.StatusOK {
			c.t.Fatalf("GET %s: %d\n%s", path, code, body)
		}
		for _, m := range eventLinkRE.FindAllStringSubmatch(body, -1) {
			seen = append(seen, m[1])
		}
		path = ""
		if m := findNextRE.FindStringSubmatch(body); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	return seen, pages
}

// TestFindEventByEachKey: an event is found by its id (a redirect to its
// page, which shows its state, headers and payload escaped), an unknown id
// is 404 and a malformed one 400; an aggregate shows its lane (published
// through, head, pending, parked, quarantined) and its events a page at a
// time; a type search pages by keyset through every unsettled event of the
// type, in order, and finds settled ones too.
func TestFindEventByEachKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 2, 2, 3)
	c := newClient(t, serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken, PageSize: 2}))
	if code, loc := c.location("/events?id=" + f.quarantined[0].String()); code != http.StatusSeeOther || loc != "/login" {
		t.Fatalf("search without logging in: %d to %q, want 303 to /login", code, loc)
	}
	c.login("alice")

	// By id.
	q := f.quarantined[0]
	if code, loc := c.location("/events?id=" + q.String()); code != http.StatusSeeOther || loc != "/events/"+q.String() {
		t.Fatalf("search by id: %d to %q, want 303 to the event's page", code, loc)
	}
	code, body := c.get("/events/" + q.String())
	if code != http.StatusOK || !strings.Contains(body, `id="state">quarantined<`) || !strings.Contains(body, "merchant &lt;acme&gt;") {
		t.Fatalf("the quarantined event's page: %d, no state or escaped last error:\n%s", code, body)
	}
	if code, body := c.get("/events?id=" + uuid.NewString()); code != http.StatusNotFound || !strings.Contains(body, `id="not-found"`) {
		t.Fatalf("unknown id: %d, want 404 saying so:\n%s", code, body)
	}
	for _, bad := range []string{"/events?id=not-a-uuid", "/events/not-a-uuid", "/events?aggregate_type=payment", "/events?event_type=X&after=zz!"} {
		if code, _ := c.get(bad); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", bad, code)
		}
	}

	// By aggregate: the lane, then its events by sequence, two a page.
	ev, err := f.admin.Event(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	code, body = c.get("/events?aggregate_type=payment&aggregate_id=" + ev.AggregateID)
	for _, want := range []string{`id="published-through">#0 <span class="muted">of #3 written`, `id="lane-pending">2 <span class="muted">(2 parked`, `id="lane-quarantined">1<`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the lane of %s lacks %s:\n%s", ev.AggregateID, want, body)
		}
	}
	seen, pages := c.walk("/events?aggregate_type=payment&aggregate_id="+ev.AggregateID, 3)
	lane, err := f.admin.ListAggregateEvents(ctx, outbox.AggregateEventsFilter{AggregateType: "payment", AggregateID: ev.AggregateID})
	if err != nil {
		t.Fatal(err)
	}
	if pages != 2 || len(seen) != 3 || len(lane) != 3 {
		t.Fatalf("the aggregate's events: %v in %d pages (%d in the lane), want 3 in 2", seen, pages, len(lane))
	}
	for i, e := range lane {
		if seen[i] != e.ID.String() || e.Sequence != int64(i+1) {
			t.Fatalf("event %d listed %s, want #%d %s", i, seen[i], e.Sequence, e.ID)
		}
		if want := map[bool]string{true: "quarantined", false: "parked"}[i == 0]; e.State() != want {
			t.Fatalf("#%d is %s, want %s", e.Sequence, e.State(), want)
		}
	}

	// By type: every unsettled PaymentCaptured (two lanes of three), two a
	// page, by aggregate and sequence; settled OrderPaid events too.
	seen, _ = c.walk("/events?event_type=PaymentCaptured", 5)
	var want []string
	for _, id := range []string{"pay-0000", "pay-0001"} {
		evs, err := f.admin.ListAggregateEvents(ctx, outbox.AggregateEventsFilter{AggregateType: "payment", AggregateID: id})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			want = append(want, e.ID.String())
		}
	}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Fatalf("type search listed %v, want %v", seen, want)
	}
	if seen, _ = c.walk("/events?event_type=PaymentCaptured&scope=settled", 3); len(seen) != 0 {
		t.Fatalf("settled PaymentCaptured: %v, want none", seen)
	}
	if seen, _ = c.walk("/events?event_type=OrderPaid&scope=settled", 3); len(seen) != 2 {
		t.Fatalf("settled OrderPaid: %v, want the two aggregates' #2", seen)
	}
}

// TestFindByTypeScanIsBounded: each call of a type search reads at most
// its scan limit and says where to go on; following it finds every event
// of the type once, among the unsettled and among the settled.
func TestFindByTypeScanIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 4, 3, 4)
	for _, tc := range []struct {
		settled bool
		typ     string
		want    int
	}{{false, "PaymentCaptured", 12}, {true, "OrderShipped", 4}, {true, "OrderCreated", 8}} {
		filter := outbox.EventTypeFilter{EventType: tc.typ, Settled: tc.settled, Limit: 2, ScanLimit: 3}
		seen := map[uuid.UUID]bool{}
		for calls := 0; ; calls++ {
			if calls > 30 {
				t.Fatalf("%s: more than 30 calls", tc.typ)
			}
			page, err := f.admin.FindEventsByType(ctx, filter)
			if err != nil {
				t.Fatal(err)
			}
			if page.Scanned > 3 || len(page.Events) > 2 {
				t.Fatalf("%s: a call read %d events and returned %d; want at most 3 and 2", tc.typ, page.Scanned, len(page.Events))
			}
			for _, e := range page.Events {
				if e.Type != tc.typ || seen[e.ID] || (e.PublishedAt != nil) != tc.settled {
					t.Fatalf("%s: found %s %s (settled %v) again or wrongly", tc.typ, e.Type, e.ID, e.PublishedAt != nil)
				}
				seen[e.ID] = true
			}
			if page.Next == nil {
				break
			}
			filter.After = page.Next
		}
		if len(seen) != tc.want {
			t.Fatalf("%s (settled %v): found %d, want %d", tc.typ, tc.settled, len(seen), tc.want)
		}
	}
}

// TestEventPayloadEscapedAndDownloaded: a payload and headers holding
// markup are shown escaped on the event's page, and the payload downloads
// as its exact bytes, as an attachment of a type no browser renders.
func TestEventPayloadEscapedAndDownloaded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 0, 1)
	id := writeHostile(t, f)
	srv := serve(t, outboxconsole.Config{Pool: f.pool, Schema: f.schema, Token: testToken})
	c := newClient(t, srv)
	if code, loc := c.location("/events/" + id.String() + "/payload"); code != http.StatusSeeOther || loc != "/login" {
		t.Fatalf("download without logging in: %d to %q, want 303 to /login", code, loc)
	}
	c.login("alice")
	code, body := c.get("/events/" + id.String())
	if code != http.StatusOK {
		t.Fatalf("event page: %d\n%s", code, body)
	}
	for _, bad := range []string{"<script>alert", "<img src=x", "<b onmouseover"} {
		if strings.Contains(body, bad) {
			t.Fatalf("the event's page renders %q unescaped:\n%s", bad, body)
		}
	}
	for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;", "&lt;b onmouseover=alert(3)&gt;hi&lt;/b&gt;", "traceparent", `href="/events/` + id.String() + `/payload"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the event's page lacks %s:\n%s", want, body)
		}
	}

	resp, err := c.http.Get(srv.URL + "/events/" + id.String() + "/payload")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != http.StatusOK || string(raw) != hostilePayload {
		t.Fatalf("download: %d %q, want 200 and the payload's bytes %q", resp.StatusCode, raw, hostilePayload)
	}
	if h.Get("Content-Type") != "application/octet-stream" || h.Get("Content-Disposition") != `attachment; filename="`+id.String()+`.json"` ||
		h.Get("X-Content-Type-Options") != "nosniff" || !strings.HasPrefix(h.Get("Content-Security-Policy"), "sandbox") {
		t.Fatalf("download headers: %v", h)
	}
	if code, _ := c.get("/events/" + uuid.NewString() + "/payload"); code != http.StatusNotFound {
		t.Fatalf("download of an unknown event: %d, want 404", code)
	}
}
