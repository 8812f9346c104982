package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// inboxDeliver hands one event of order id to consumer's inbox.
func inboxDeliver(t *testing.T, in *inbox.Inbox, id string, seq int64, want inbox.Outcome) {
	t.Helper()
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: id, Sequence: seq, Type: "T"}
	if got, err := in.Handle(context.Background(), m, func(context.Context, pgx.Tx) error { return nil }); err != nil || got != want {
		t.Fatalf("%s %s #%d: %v, %v; want %v", in.Consumer(), id, seq, got, err, want)
	}
}

// TestInboxCommands: stuck aggregates show in `outbox inbox status` with
// their age, oldest first and limited; `outbox inbox resolve` unsticks one,
// records who and why in the audit log, and its waiting event is applied at
// the next delivery.
func TestInboxCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	billing, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	search, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "search"})
	if err != nil {
		t.Fatal(err)
	}
	inboxDeliver(t, billing, "o1", 1, inbox.Applied)
	inboxDeliver(t, billing, "o1", 4, inbox.Early) // 2 and 3 missing
	inboxDeliver(t, billing, "o2", 3, inbox.Early)
	inboxDeliver(t, search, "o1", 2, inbox.Early)
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.inbox_aggregates SET waiting_since = now() - interval '20 minutes'
		WHERE consumer_name = 'billing' AND aggregate_id = 'o1'`); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, code := runOutbox(t, nil, "inbox", "status", "--schema", schema, "--json")
	if code != 0 {
		t.Fatalf("inbox status --json: exit %d: %s", code, stderr)
	}
	var rep inbox.WaitingReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("inbox status --json output: %v\n%s", err, stdout)
	}
	if len(rep.Consumers) != 2 || rep.Consumers[0].Consumer != "billing" || rep.Consumers[0].Waiting != 2 ||
		rep.Consumers[0].OldestWaitSeconds < 1190 || rep.Consumers[1].Consumer != "search" || rep.Consumers[1].Waiting != 1 {
		t.Fatalf("consumers %+v", rep.Consumers)
	}
	if len(rep.Aggregates) != 3 {
		t.Fatalf("aggregates %+v, want 3", rep.Aggregates)
	}
	if a := rep.Aggregates[0]; a.Consumer != "billing" || a.AggregateID != "o1" || a.LastSequence != 1 || a.Wait == nil ||
		a.Wait.Expected != 2 || a.Wait.Seen != 4 || a.Wait.AgeSeconds < 1190 || a.Wait.AgeSeconds > 1300 {
		t.Fatalf("oldest wait %+v (%+v), want billing order/o1 at mark 1, expecting 2, seen 4, 20 minutes old", a, a.Wait)
	}

	stdout, _, code = runOutbox(t, nil, "inbox", "status", "--schema", schema, "--consumer", "billing")
	for _, want := range []string{"billing   2        20m", "order/o1   1     2        4     ", "order/o2   0     1        3"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("inbox status --consumer billing lacks %q (exit %d):\n%s", want, code, stdout)
		}
	}
	if strings.Contains(stdout, "search") {
		t.Fatalf("inbox status --consumer billing shows another consumer:\n%s", stdout)
	}
	stdout, _, _ = runOutbox(t, nil, "inbox", "status", "--schema", schema, "--limit", "1")
	if !strings.Contains(stdout, "(oldest 1 of 3 shown; use --limit)") || strings.Count(stdout, "order/") != 1 {
		t.Fatalf("inbox status --limit 1:\n%s", stdout)
	}

	stdout, stderr, code = runOutbox(t, nil, "inbox", "resolve", "--schema", schema, "--consumer", "billing",
		"--aggregate-type", "order", "--aggregate-id", "o1", "--reason", "2-3 dropped by MaxDeliver; INC-12", "--by", "alice")
	if code != 0 || !strings.Contains(stdout, "mark 1 -> 3, resolved by alice") || !strings.Contains(stdout, "events #2..#3 will not be applied; #4 is applied") {
		t.Fatalf("inbox resolve: exit %d, %s%s", code, stdout, stderr)
	}
	var ops int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_operations
		WHERE action = 'inbox_resolve' AND actor = 'alice' AND reason = '2-3 dropped by MaxDeliver; INC-12'
		  AND detail->>'consumer' = 'billing' AND detail->>'aggregate_id' = 'o1' AND (detail->>'mark')::int = 3`).Scan(&ops); err != nil || ops != 1 {
		t.Fatalf("%d audit rows, %v; want 1", ops, err)
	}
	var kind, by string
	if err := pool.QueryRow(ctx, `SELECT start_kind, start_by FROM `+schema+`.inbox_aggregates
		WHERE consumer_name = 'billing' AND aggregate_id = 'o1' AND waiting_since IS NULL`).Scan(&kind, &by); err != nil || kind != "resolved" || by != "alice" {
		t.Fatalf("mark row after resolve: %q by %q, %v", kind, by, err)
	}
	inboxDeliver(t, billing, "o1", 4, inbox.Applied) // the waiting event, redelivered
	stdout, _, _ = runOutbox(t, nil, "status", "--schema", schema)
	if !strings.Contains(stdout, "inbox_resolve  alice") {
		t.Fatalf("status does not show the resolve among the recent operator actions:\n%s", stdout)
	}
	stdout, _, _ = runOutbox(t, nil, "inbox", "status", "--schema", schema, "--json", "--consumer", "billing")
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || len(rep.Aggregates) != 1 || rep.Aggregates[0].AggregateID != "o2" {
		t.Fatalf("after resolving o1, billing waits on %+v (%v), want only o2", rep.Aggregates, err)
	}

	// With --to, a mark is set explicitly, and a JSON answer says so.
	stdout, stderr, code = runOutbox(t, nil, "inbox", "resolve", "--schema", schema, "--consumer", "search", "--aggregate-type", "order",
		"--aggregate-id", "o7", "--to", "40", "--reason", "seeded from the legacy system", "--json")
	var a inbox.AggregateInfo
	if code != 0 || json.Unmarshal([]byte(stdout), &a) != nil || a.LastSequence != 40 || a.Start == nil || a.Start.By != "tester" {
		t.Fatalf("inbox resolve --to 40 --json: exit %d, %+v, %s%s", code, a, stdout, stderr)
	}
	inboxDeliver(t, search, "o7", 41, inbox.Applied)
}

func TestInboxCommandsRefuseBadArguments(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	inboxDeliver(t, in, "o1", 1, inbox.Applied)
	empty := outboxtest.UniqueName(t, "empty")
	s := []string{"--schema", schema}
	with := func(args ...string) []string { return append(args, s...) }
	agg := []string{"--consumer", "billing", "--aggregate-type", "order", "--aggregate-id", "o1"}
	resolve := func(args ...string) []string {
		return with(append(append([]string{"inbox", "resolve"}, agg...), args...)...)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{with("inbox"), 2, "missing subcommand: status, resolve"},
		{with("inbox", "purge"), 2, `unknown subcommand "purge"`},
		{with("inbox", "--consumer", "x"), 2, "comes before the flags"},
		{with("inbox", "status", "extra"), 2, `unexpected argument "extra"`},
		{with("inbox", "status", "--limit", "0"), 2, "--limit 0 must be positive"},
		{[]string{"inbox", "status", "--schema", empty}, 1, "has no outbox tables: run 'outbox migrate"},
		{with("inbox", "resolve", "--reason", "x"), 2, "--consumer is required"},
		{with("inbox", "resolve", "--consumer", "billing", "--reason", "x"), 2, "--aggregate-type and --aggregate-id are required"},
		{resolve(), 2, "--reason is required"},
		{resolve("--reason", "x", "--to", "-1"), 2, "--to -1 is negative"},
		{resolve("--reason", "x", "--by", ""), 2, "--by is empty"},
		{resolve("--reason", "x", "o1"), 2, `unexpected argument "o1"`},
		{resolve("--reason", "x"), 1, "consumer billing, aggregate order/o1 is not waiting on a gap (its mark is 1); pass --to N"},
		{resolve("--reason", "x", "--to", "1"), 1, "--to 1 is not above the mark (its mark is 1)"},
		{with("inbox", "resolve", "--consumer", "billing", "--aggregate-type", "order", "--aggregate-id", "nope", "--reason", "x"), 1, "no mark and no wait recorded in schema " + schema},
	} {
		_, stderr, code := runOutbox(t, nil, c.args...)
		line := strings.TrimSpace(stderr)
		if code != c.code || !strings.Contains(line, c.want) || strings.Contains(line, "\n") {
			t.Errorf("outbox %s: exit %d, stderr %q; want exit %d and one line containing %q", strings.Join(c.args, " "), code, stderr, c.code, c.want)
		}
	}
	for _, args := range [][]string{{"inbox", "--help"}, {"inbox", "status", "--help"}, {"inbox", "resolve", "-h"}} {
		stdout, stderr, code := runOutbox(t, nil, args...)
		if code != 0 || !strings.Contains(stdout+stderr, "Usage: outbox inbox") {
			t.Errorf("outbox %s: exit %d, output %q", strings.Join(args, " "), code, stdout+stderr)
		}
	}
}
