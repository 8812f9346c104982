package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestPublishedPerMinuteCountsTheLastHour: the series has one entry per
// minute of the last hour and the current one, counts published events in
// their minute, and leaves out skipped events and older ones.
func TestPublishedPerMinuteCountsTheLastHour(t *testing.T) {
	t.Parallel()
	forAdminKinds(t, testPublishedPerMinuteCountsTheLastHour)
}

func testPublishedPerMinuteCountsTheLastHour(t *testing.T, k adminKind) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := k.newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 7, 1) // agg-0..agg-6
	// Settle them by hand at chosen times: 3 five minutes ago, 2 fifty-nine
	// minutes ago, 1 sixty-one minutes ago (too old), 1 skipped just now.
	minuteOf := map[string]time.Time{}
	for _, s := range []struct {
		ids []string
		ago string
	}{{[]string{"agg-0", "agg-1", "agg-2"}, "5 minutes"}, {[]string{"agg-3", "agg-4"}, "59 minutes"}, {[]string{"agg-5"}, "61 minutes"}} {
		for _, id := range s.ids {
			var m time.Time
			if err := pool.QueryRow(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '`+s.ago+`'
WHERE aggregate_id = $1 RETURNING date_trunc('minute', published_at)`, id).Scan(&m); err != nil {
				t.Fatal(err)
			}
			minuteOf[id] = m.UTC()
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now(), skipped_at = now(), skipped_by = 'x',
	skip_reason = 'y', skipped_from = aggregate_sequence WHERE aggregate_id = 'agg-6'`); err != nil {
		t.Fatal(err)
	}
	series, err := admin.PublishedPerMinute(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(series) != 61 {
		t.Fatalf("%d minutes, want 61", len(series))
	}
	got := map[time.Time]int64{}
	for i, m := range series {
		if i > 0 && !m.Minute.Equal(series[i-1].Minute.Add(time.Minute)) {
			t.Fatalf("minute %d is %s after %s: not consecutive", i, m.Minute, series[i-1].Minute)
		}
		got[m.Minute] = m.Published
	}
	if since := time.Since(series[60].Minute); since < 0 || since > 2*time.Minute {
		t.Fatalf("the last minute is %s, %s ago; want the current one", series[60].Minute, since)
	}
	var total int64
	for _, m := range series {
		total += m.Published
	}
	if got[minuteOf["agg-0"]] != 3 || got[minuteOf["agg-3"]] != 2 || total != 5 {
		t.Fatalf("series %v: want 3 in %s, 2 in %s, 5 in all (the 61-minute-old and the skipped one left out)",
			series, minuteOf["agg-0"], minuteOf["agg-3"])
	}
}

// quarantineAll runs a relay whose destination refuses every event of
// aggregates refused, until those aggregates' heads are quarantined.
func quarantineAll(t *testing.T, schema string, admin *outbox.Admin, n int, refused func(id string) bool) {
	t.Helper()
	pool := outboxtest.Pool(t)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if refused(m.AggregateID) {
				errs[i] = outbox.Permanent(errors.New("refused"))
			}
		}
		return errs
	})
	_, stop := startRelay(t, pool, quietConfig(schema, pub))
	outboxtest.Eventually(t, 30*time.Second, "heads quarantined", func() bool {
		st, err := admin.Status(context.Background())
		return err == nil && st.Quarantined == int64(n) && st.Leased == 0
	})
	stop()
}

// TestListQuarantinedPagesAndPreviews: walking ListQuarantined page by page
// with After lists every quarantined event once, in order; the preview is
// the payload's start, cut in SQL.
func TestListQuarantinedPagesAndPreviews(t *testing.T) {
	t.Parallel()
	forAdminKinds(t, testListQuarantinedPagesAndPreviews)
}

func testListQuarantinedPagesAndPreviews(t *testing.T, k adminKind) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := k.newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 7, 2)
	quarantineAll(t, schema, admin, 7, func(string) bool { return true })
	all, err := admin.ListQuarantined(ctx, outbox.QuarantineFilter{})
	if err != nil || len(all) != 7 {
		t.Fatalf("one page of all: %d events, %v; want 7", len(all), err)
	}
	var walked []uuid.UUID
	f := outbox.QuarantineFilter{Limit: 3, PreviewBytes: 10}
	for pages := 0; ; pages++ {
		page, err := admin.ListQuarantined(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 || pages > 3 {
			break
		}
		for _, e := range page {
			walked = append(walked, e.ID)
			want := `{"order_id": "agg-`[:10]
			if e.PayloadPreview != want {
				t.Fatalf("preview %q, want the payload's first 10 bytes %q", e.PayloadPreview, want)
			}
		}
		c := page[len(page)-1].QuarantineCursor()
		f.After = &c
	}
	if len(walked) != 7 {
		t.Fatalf("pages of 3 walked %d events, want 7", len(walked))
	}
	for i := range all {
		if walked[i] != all[i].ID {
			t.Fatalf("event %d: paged %s, unpaged %s", i, walked[i], all[i].ID)
		}
		if all[i].PayloadPreview != "" {
			t.Fatalf("a preview without PreviewBytes: %q", all[i].PayloadPreview)
		}
	}
}

// TestOperationsPages: Operations lists the audit log newest first, a page
// at a time.
func TestOperationsPages(t *testing.T) {
	t.Parallel()
	forAdminKinds(t, testOperationsPages)
}

func testOperationsPages(t *testing.T, k adminKind) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := k.newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 5, 1)
	quarantineAll(t, schema, admin, 5, func(string) bool { return true })
	q, err := admin.ListQuarantined(ctx, outbox.QuarantineFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range q {
		if _, err := admin.Skip(ctx, e.ID, "op", fmt.Sprintf("reason %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var reasons []string
	f := outbox.OperationFilter{Limit: 2}
	for pages := 0; pages < 5; pages++ {
		ops, err := admin.Operations(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(ops) == 0 {
			break
		}
		for _, o := range ops {
			reasons = append(reasons, o.Reason)
			if o.Action != "skip" || o.Detail["aggregate_type"] != "order" || o.EventID == nil {
				t.Fatalf("operation %+v: want a skip of an order event, its detail decoded", o)
			}
		}
		f.Before = ops[len(ops)-1].ID
	}
	if got := strings.Join(reasons, ","); got != "reason 4,reason 3,reason 2,reason 1,reason 0" {
		t.Fatalf("operations by page: %s; want newest first, each once", got)
	}
	if _, err := admin.Operations(ctx, outbox.OperationFilter{Limit: -1}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
}

// TestReplayTakesAllNilErrorsAsSuccess: a publisher that answers a slice of
// nil errors instead of nil (against the contract, but harmless) has
// published everything: the replay ends, it does not retry nothing until it
// panics.
func TestReplayTakesAllNilErrorsAsSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 2, 3)
	_, stop := startRelay(t, pool, quietConfig(schema, outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error { return nil })))
	outboxtest.Eventually(t, 30*time.Second, "everything published", func() bool { return unpublished(t, pool, schema) == 0 })
	stop()
	calls := 0
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		calls++
		return make([]error, len(msgs))
	})
	res, err := admin.Replay(ctx, pub, outbox.ReplayConfig{By: "op", RetryBackoff: time.Millisecond})
	if err != nil || res.Events != 6 || calls != 3 {
		t.Fatalf("replay: %d events in %d calls, %v; want 6 in 3 (one per wave)", res.Events, calls, err)
	}
}
