package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// downUntil is a destination that refuses every publish and probe as
// unavailable until up is set, and accepts everything after.
type downUntil struct{ up atomic.Bool }

func (p *downUntil) Publish(_ context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	if !p.up.Load() {
		for i := range errs {
			errs[i] = outbox.Unavailable(errors.New(`Post "https://hooks.example.com/services/T0/B0/hunter2-secret": connection refused`))
		}
	}
	return errs
}

func (p *downUntil) Probe(context.Context) error {
	if !p.up.Load() {
		return outbox.Unavailable(errors.New(`Post "https://hooks.example.com/services/T0/B0/hunter2-secret": connection refused`))
	}
	return nil
}

// TestRelayRecordsItsHealth: a relay whose destination is down records in
// its heartbeat row that it is not ready, why (what /readyz says) and since
// when; once the destination is back it records that it is ready, keeps
// the last error, and its failed and published counts per minute reach
// Admin.History.
func TestRelayRecordsItsHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 3, 2)
	pub := &downUntil{}
	cfg := quietConfig(schema, pub)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	cfg.OutageProbeMax = 50 * time.Millisecond
	cfg.DisableNotify = true
	relay, _ := startRelay(t, pool, cfg)

	health := func() *outbox.RelayHealth {
		st, err := admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range st.Relays {
			if r.ID == relay.ID() {
				return r.Health
			}
		}
		return nil
	}
	var down *outbox.RelayHealth
	outboxtest.Eventually(t, 30*time.Second, "the relay records that the destination is unavailable", func() bool {
		down = health()
		return down != nil && !down.Ready && strings.Contains(down.Reason, "destination unavailable") && strings.Contains(down.Reason, "hooks.example.com") && down.NotReadySince != nil
	})
	if strings.Contains(down.Reason, "hunter2") {
		t.Fatalf("the recorded reason holds a secret: %q", down.Reason)
	}
	since := *down.NotReadySince
	outboxtest.Eventually(t, 30*time.Second, "a later heartbeat keeps the start of the spell", func() bool {
		h := health()
		return h != nil && !h.Ready && h.RecordedAt.After(down.RecordedAt)
	})
	if h := health(); h.NotReadySince == nil || !h.NotReadySince.Equal(since) {
		t.Fatalf("not ready since %v, then %v: the spell's start moved", since, h.NotReadySince)
	}

	pub.up.Store(true)
	var up *outbox.RelayHealth
	outboxtest.Eventually(t, 30*time.Second, "the relay records that it is ready again, with the last error", func() bool {
		up = health()
		return up != nil && up.Ready && up.NotReadySince == nil && strings.Contains(up.LastError, "destination unavailable") && up.LastErrorAt != nil
	})
	outboxtest.Eventually(t, 30*time.Second, "every event published and the counts recorded", func() bool {
		h := health()
		if h == nil {
			return false
		}
		var published, failed int64
		for _, m := range h.Minutes {
			published += m.Published
			failed += m.Failed
		}
		return published == 6 && failed > 0
	})
	hist, err := admin.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 61 {
		t.Fatalf("history has %d minutes, want 61", len(hist))
	}
	var published, failed int64
	for _, m := range hist {
		published += m.Published
		failed += m.Failed
	}
	if published != 6 || failed == 0 {
		t.Fatalf("history: %d published and %d failed, want 6 and some", published, failed)
	}
	if last := hist[60]; last.Unsettled != 0 {
		t.Fatalf("history: %d unsettled now, want 0", last.Unsettled)
	}
}

// TestHistoryRebuildsTheBacklog: the backlog at each minute's end counts
// the events that had occurred and were not yet settled then; the latency
// is published_at - occurred_at of the minute's events.
func TestHistoryRebuildsTheBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	admin := newAdmin(t, pool, schema)
	writeEvents(t, pool, w, 4, 1) // agg-0..agg-3
	// agg-0: occurred 30 minutes ago, published 20 minutes ago (10 minutes
	// of latency); agg-1: occurred 30 minutes ago, still pending; agg-2:
	// occurred 90 minutes ago, published 10 minutes ago; agg-3: occurred
	// 90 minutes ago, published 70 minutes ago (never in the window's
	// backlog).
	for _, s := range []struct{ id, occurred, published string }{
		{"agg-0", "30 minutes", "20 minutes"},
		{"agg-1", "30 minutes", ""},
		{"agg-2", "90 minutes", "10 minutes"},
		{"agg-3", "90 minutes", "70 minutes"},
	} {
		set := `occurred_at = now() - interval '` + s.occurred + `'`
		if s.published != "" {
			set += `, published_at = now() - interval '` + s.published + `'`
		}
		if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET `+set+` WHERE aggregate_id = $1`, s.id); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := admin.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 61 {
		t.Fatalf("history has %d minutes, want 61", len(hist))
	}
	// Minute i ends (60-i) minutes before the current minute's start: at
	// i = 0 (about an hour ago) only agg-2 was unsettled; from 30 minutes
	// ago agg-0 and agg-1 too; agg-0 settled 20 minutes ago, agg-2 10
	// minutes ago; now only agg-1. The boundaries fall within a minute of
	// those marks, so the test checks the minutes clear of them.
	want := func(minutesAgo int) int64 {
		switch {
		case minutesAgo > 32:
			return 1
		case minutesAgo > 22 && minutesAgo < 28:
			return 3
		case minutesAgo > 12 && minutesAgo < 18:
			return 2
		case minutesAgo < 8:
			return 1
		}
		return -1
	}
	for i, m := range hist {
		if n := want(60 - i); n >= 0 && m.Unsettled != n {
			t.Errorf("minute %s (%d minutes before this one): %d unsettled, want %d", m.Minute.Format("15:04"), 60-i, m.Unsettled, n)
		}
	}
	var published int64
	for _, m := range hist {
		published += m.Published
		if m.Published == 1 && m.LatencyP50Seconds > 0 && (m.LatencyMaxSeconds < 599 || m.LatencyMaxSeconds > 4801) {
			t.Errorf("minute %s: latency max %gs, want 600 or 4800", m.Minute.Format("15:04"), m.LatencyMaxSeconds)
		}
	}
	if published != 2 {
		t.Fatalf("history: %d published, want agg-0 and agg-2", published)
	}
}
