package outboxprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxprom"
)

// TestInboxWaitingGauges: an aggregate stuck on a gap shows in
// inbox_waiting_aggregates and inbox_oldest_waiting_age_seconds of its
// consumer (a healthy consumer shows 0), fires the shipped alert rule once
// old enough, and leaves both when an operator resolves the gap.
func TestInboxWaitingGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	admin, err := inbox.NewAdmin(pool, inbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	m, err := outboxprom.New(outboxprom.Config{Schema: schema, Inbox: admin, GaugesMaxAge: time.Nanosecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	scrape := func() map[string]*dto.MetricFamily {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		return byName
	}
	handle := func(consumer, id string, seq int64, want inbox.Outcome) {
		t.Helper()
		in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: consumer, Observer: m})
		if err != nil {
			t.Fatal(err)
		}
		msg := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: id, Sequence: seq, Type: "T"}
		if got, err := in.Handle(ctx, msg, func(context.Context, pgx.Tx) error { return nil }); err != nil || got != want {
			t.Fatalf("%s %s #%d: %v, %v; want %v", consumer, id, seq, got, err, want)
		}
	}
	handle("billing", "o1", 1, inbox.Applied)
	handle("billing", "o1", 3, inbox.Early)
	handle("billing", "o2", 2, inbox.Early)
	handle("billing", "o2", 2, inbox.Early) // redelivered: still one wait
	handle("search", "o1", 1, inbox.Applied)
	// The waits began half an hour ago (no sleeping in tests).
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.inbox_aggregates SET waiting_since = now() - interval '30 minutes'
		WHERE consumer_name = 'billing' AND aggregate_id = 'o1'`); err != nil {
		t.Fatal(err)
	}

	fams := scrape()
	billing := map[string]string{"schema": schema, "consumer": "billing"}
	search := map[string]string{"schema": schema, "consumer": "search"}
	if got := value(t, fams, "inbox_waiting_aggregates", billing); got != 2 {
		t.Errorf("inbox_waiting_aggregates{billing} = %g, want 2", got)
	}
	if got := value(t, fams, "inbox_oldest_waiting_age_seconds", billing); got < 1790 || got > 1900 {
		t.Errorf("inbox_oldest_waiting_age_seconds{billing} = %g, want about 1800", got)
	}
	if got := value(t, fams, "inbox_waiting_aggregates", search); got != 0 {
		t.Errorf("inbox_waiting_aggregates{search} = %g, want 0", got)
	}
	if got := value(t, fams, "inbox_early_total", map[string]string{"schema": schema, "consumer": "billing"}); got != 3 {
		t.Errorf("inbox_early_total{billing} = %g, want 3", got)
	}

	groups, err := promrules.Load("../deploy/prometheus/outbox-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rule string
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == "InboxAggregateWaitingOnGap" {
				rule = r.Expr
			}
		}
	}
	if rule == "" {
		t.Fatal("alert rules lack InboxAggregateWaitingOnGap")
	}
	fired, err := promrules.Eval(rule, fams)
	if err != nil || len(fired) != 1 || fired[0].Labels["consumer"] != "billing" || fired[0].Labels["schema"] != schema {
		t.Fatalf("InboxAggregateWaitingOnGap evaluated to %v, %v; want it firing for billing", fired, err)
	}

	for _, id := range []string{"o1", "o2"} {
		if _, err := admin.Resolve(ctx, inbox.Resolution{Consumer: "billing", AggregateType: "order", AggregateID: id,
			By: "test", Reason: "lost by the broker"}); err != nil {
			t.Fatal(err)
		}
	}
	fams = scrape()
	if got := value(t, fams, "inbox_waiting_aggregates", billing); got != 0 {
		t.Errorf("after resolving, inbox_waiting_aggregates{billing} = %g, want 0", got)
	}
	if got := value(t, fams, "inbox_oldest_waiting_age_seconds", billing); got != 0 {
		t.Errorf("after resolving, inbox_oldest_waiting_age_seconds{billing} = %g, want 0", got)
	}
	if fired, err := promrules.Eval(rule, fams); err != nil || len(fired) != 0 {
		t.Fatalf("after resolving, the alert evaluated to %v, %v; want silent", fired, err)
	}
}
