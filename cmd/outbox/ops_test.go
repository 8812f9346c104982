package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

// runOutbox runs the outbox binary with args against the test database and
// returns its stdout, stderr and exit code.
func runOutbox(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, outboxBinary(t), args...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL(), "OUTBOX_FAILPOINTS=", "USER=tester"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = -int(ws.Signal())
		}
	default:
		t.Fatalf("run outbox %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// insertEvent writes one row directly, in any state.
func insertEvent(t *testing.T, pool *pgxpool.Pool, schema, aggregateID string, seq int64, set string) uuid.UUID {
	t.Helper()
	id := uuid.New()
	if _, err := pool.Exec(context.Background(), `INSERT INTO `+schema+`.outbox_events
		(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload) VALUES ($1, 'order', $2, $3, 'Step', '{}')`,
		id, aggregateID, seq); err != nil {
		t.Fatal(err)
	}
	if set != "" {
		if _, err := pool.Exec(context.Background(), `UPDATE `+schema+`.outbox_events SET `+set+` WHERE event_id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

func TestOpsCommandsRefuseBadArguments(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	pending := insertEvent(t, pool, schema, "o1", 1, "")
	empty := outboxtest.UniqueName(t, "empty")
	s := []string{"--schema", schema}
	with := func(args ...string) []string { return append(args, s...) }
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{with("status", "extra"), 2, `unexpected argument "extra"`},
		{with("status", "--bogus"), 2, "flag provided but not defined: -bogus"},
		{with("status", "--max-quarantined", "3"), 2, "--max-pending-age and --max-quarantined go with --check"},
		{with("status", "--check", "--max-pending-age", "0s"), 2, "--max-pending-age must be positive"},
		{[]string{"status", "--schema", empty}, 1, "has no outbox tables: run 'outbox migrate"},
		{[]string{"status", "--schema", "bad;name"}, 1, "invalid schema name"},
		{with("quarantine"), 2, "missing subcommand"},
		{with("quarantine", "purge"), 2, `unknown subcommand "purge"`},
		{with("quarantine", "retry"), 2, "missing the event id"},
		{with("quarantine", "retry", "not-a-uuid"), 2, `invalid event id "not-a-uuid": not a UUID`},
		{with("quarantine", "retry", uuid.NewString(), uuid.NewString()), 2, "one event id at a time"},
		{with("quarantine", "retry", "00000000-0000-0000-0000-00000000002a"), 1, "no event 00000000-0000-0000-0000-00000000002a in schema " + schema},
		{with("quarantine", "skip", pending.String()), 2, "--reason is required"},
		{with("quarantine", "skip", pending.String(), "--reason", "x", "--by", ""), 2, "--by is empty"},
		{with("quarantine", "skip", pending.String(), "--reason", "x"), 1, "is not quarantined: it is pending"},
		{with("quarantine", "list", "--limit", "0"), 2, "--limit 0 must be positive"},
		{with("cleanup"), 2, "--older-than is required"},
		{with("cleanup", "--older-than", "-1h"), 2, "-1h is negative"},
		{with("cleanup", "--older-than", "soon"), 2, `invalid duration "soon"`},
		{with("cleanup", "--older-than", "7d", "--inbox-older-than", "1d"), 2, "shorter than the replay horizon"},
		{with("cleanup", "--inbox-older-than", "1d"), 2, "--older-than is required"},
		{with("cleanup", "--older-than", "1h", "--batch-size", "0"), 2, "--batch-size 0 must be positive"},
		{with("replay"), 2, "no filter given"},
		{with("replay", "--since", "2h", "--until", "3h"), 2, "is not after --since"},
		{with("replay", "--since", "yesterday"), 2, `invalid time "yesterday"`},
		{with("replay", "--aggregate-type", "order", "--destination", "mqtt://x"), 1, `unsupported scheme "mqtt" (supported: nats, kafka, amqp, http, https)`},
		{with("replay", "--aggregate-type", "order", "--destination", "kafka://u:secret@x"), 1, "kafka://u:xxxxx@x: a user needs sasl=plain"},
		{with("replay", "--aggregate-type", "order", "--destination", "https://u:secret@x/hook"), 1, "credentials in the URL are refused"},
		{with("replay", "--aggregate-type", "order", "--destination", "https://127.0.0.1:1/hook"), 1, "no signing secret: set OUTBOX_WEBHOOK_SECRET"},
		{with("relay", "--destination", "nats://127.0.0.1:1", "--cleanup-older-than", "1h", "--cleanup-inbox-older-than", "1m"), 2, "shorter than the replay horizon"},
		{with("relay", "--destination", "nats://127.0.0.1:1", "--cleanup-inbox-older-than", "1m"), 2, "needs --cleanup-older-than"},
	} {
		_, stderr, code := runOutbox(t, nil, c.args...)
		line := strings.TrimSpace(stderr)
		if code != c.code || !strings.Contains(line, c.want) || strings.Contains(line, "\n") {
			t.Errorf("outbox %s: exit %d, stderr %q; want exit %d and one line containing %q", strings.Join(c.args, " "), code, stderr, c.code, c.want)
		}
		if strings.Contains(stderr, ":secret@") {
			t.Errorf("outbox %s: the error shows the URL's password: %q", strings.Join(c.args, " "), stderr)
		}
	}
}

func TestOpsCommandsHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"status", "--help"}, {"quarantine", "--help"}, {"quarantine", "list", "--help"}, {"quarantine", "retry", "-h"},
		{"quarantine", "skip", "--help"}, {"replay", "--help"}, {"cleanup", "--help"}, {"relay", "--help"},
	} {
		stdout, stderr, code := runOutbox(t, nil, args...)
		if code != 0 || !strings.Contains(stdout+stderr, "Usage: outbox "+args[0]) {
			t.Errorf("outbox %s: exit %d, output %q", strings.Join(args, " "), code, stdout+stderr)
		}
	}
}

// TestStatusCommand seeds every state an operator must see and reads it
// back as JSON and as text.
func TestStatusCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	insertEvent(t, pool, schema, "p1", 1, "published_at = now() - interval '10 seconds'")
	insertEvent(t, pool, schema, "p1", 2, "occurred_at = now() - interval '10 minutes'")                                                   // oldest pending
	insertEvent(t, pool, schema, "q1", 1, "quarantined_at = now(), attempt_count = 3, last_error = 'boom'")                                // quarantined
	insertEvent(t, pool, schema, "q1", 2, "")                                                                                              // blocked
	insertEvent(t, pool, schema, "q1", 3, "")                                                                                              // blocked
	insertEvent(t, pool, schema, "l1", 1, "claimed_by = 'r1', claim_token = gen_random_uuid(), claim_until = now() + interval '1 minute'") // in flight
	insertEvent(t, pool, schema, "x1", 1, "claimed_by = 'r0', claim_token = gen_random_uuid(), claim_until = now() - interval '1 minute', attempt_count = 1")
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_relays (relay_id, expires_at) VALUES ('r1', now() + interval '30 seconds'), ('r0', now() - interval '5 minutes')`); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runOutbox(t, nil, "status", "--schema", schema, "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d: %s", code, stderr)
	}
	var st outbox.Status
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json output: %v\n%s", err, stdout)
	}
	if st.Pending != 5 || st.Quarantined != 1 || st.BlockedByQuarantine != 2 || st.Leased != 1 || st.ExpiredLeases != 1 ||
		st.Retrying != 1 || st.PublishedLastMinute != 1 || st.RelaysAlive != 1 || len(st.Relays) != 2 || st.MigrationVersion != latestMigration() {
		t.Fatalf("status %+v", st)
	}
	if st.OldestUnparkedAgeSeconds < 590 || st.OldestUnparkedAgeSeconds > 660 {
		t.Fatalf("oldest unparked age %gs, want about 600", st.OldestUnparkedAgeSeconds)
	}
	if st.OldestPendingAgeSeconds < 590 || st.OldestPendingAgeSeconds > 660 {
		t.Fatalf("oldest pending age %gs, want about 600", st.OldestPendingAgeSeconds)
	}
	if len(st.AggregateTypes) != 1 || st.AggregateTypes[0].AggregateType != "order" || st.AggregateTypes[0].Pending != 5 {
		t.Fatalf("per aggregate type %+v", st.AggregateTypes)
	}
	var eventsTable bool
	for _, tb := range st.Tables {
		eventsTable = eventsTable || (tb.Table == "outbox_events" && tb.TotalBytes > 0 && tb.IndexBytes > 0)
	}
	if !eventsTable || len(st.Indexes) < 8 {
		t.Fatalf("sizes: tables %+v, %d indexes", st.Tables, len(st.Indexes))
	}
	stdout, _, code = runOutbox(t, nil, "status", "--schema", schema)
	for _, want := range []string{"relays       1 alive: r1", "pending      5 (oldest 10m", "1 in flight, 1 expired", "quarantined  1, blocking 2 later events",
		"published    1 in the last minute", "outbox_dispatch_idx"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("status output lacks %q (exit %d):\n%s", want, code, stdout)
		}
	}

	// --check: a relay is alive, but the oldest pending event is 10 minutes
	// old and one event is quarantined.
	stdout, stderr, code = runOutbox(t, nil, "status", "--schema", schema, "--check")
	if code != 1 || !strings.Contains(stderr, "check failed: the oldest pending event not parked behind a quarantine is 10m") ||
		!strings.Contains(stderr, "1 quarantined (limit 0), blocking 2 later events") || strings.Contains(stderr, "no relay alive") ||
		!strings.Contains(stdout, "pending      5") {
		t.Fatalf("status --check: exit %d\nstderr: %s\nstdout: %s", code, stderr, stdout)
	}
	stdout, stderr, code = runOutbox(t, nil, "status", "--schema", schema, "--check", "--json", "--max-pending-age", "15m", "--max-quarantined", "1")
	var checked struct {
		Pending int64 `json:"pending"`
		Check   struct {
			OK       bool     `json:"ok"`
			Problems []string `json:"problems"`
		} `json:"check"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &checked) != nil || !checked.Check.OK || len(checked.Check.Problems) != 0 || checked.Pending != 5 {
		t.Fatalf("status --check --json under raised thresholds: exit %d, %+v\nstderr: %s\nstdout: %s", code, checked, stderr, stdout)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+schema+`.outbox_relays`); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runOutbox(t, nil, "status", "--schema", schema, "--check", "--max-pending-age", "15m", "--max-quarantined", "1")
	if code != 1 || !strings.Contains(stderr, "no relay alive (5 pending): nothing publishes") {
		t.Fatalf("status --check without a relay: exit %d: %s", code, stderr)
	}
}

// TestQuarantineCommands lists, skips and retries quarantined events from
// the command line, with flags before or after the id.
func TestQuarantineCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	poison := insertEvent(t, pool, schema, "o1", 1, "quarantined_at = now() - interval '1 minute', attempt_count = 1, last_error = 'rejected: bad schema'")
	insertEvent(t, pool, schema, "o1", 2, "")
	flaky := insertEvent(t, pool, schema, "o2", 1, "quarantined_at = now(), attempt_count = 20, last_error = 'timeout', available_at = now() + interval '1 hour'")

	stdout, stderr, code := runOutbox(t, nil, "quarantine", "list", "--schema", schema, "--json")
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	var list []outbox.EventInfo
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != poison || list[0].Blocked != 1 || list[0].LastError != "rejected: bad schema" || list[1].ID != flaky {
		t.Fatalf("quarantine list %+v", list)
	}
	stdout, _, _ = runOutbox(t, nil, "quarantine", "list", "--schema", schema)
	if !strings.Contains(stdout, poison.String()) || !strings.Contains(stdout, "rejected: bad schema") {
		t.Fatalf("list output:\n%s", stdout)
	}

	stdout, stderr, code = runOutbox(t, nil, "quarantine", "skip", "--schema", schema, poison.String(), "--reason", "bad schema, fixed by hand in INC-7", "--by", "alice")
	if code != 0 || !strings.Contains(stdout, "skipped by alice") {
		t.Fatalf("skip: exit %d, %s%s", code, stdout, stderr)
	}
	var by, reason string
	var skippedAt, publishedAt *time.Time
	var ops int
	if err := pool.QueryRow(ctx, `SELECT skipped_by, skip_reason, skipped_at, published_at,
		(SELECT count(*) FROM `+schema+`.outbox_operations WHERE action = 'skip' AND event_id = $1 AND actor = 'alice')
		FROM `+schema+`.outbox_events WHERE event_id = $1`, poison).Scan(&by, &reason, &skippedAt, &publishedAt, &ops); err != nil {
		t.Fatal(err)
	}
	if by != "alice" || reason != "bad schema, fixed by hand in INC-7" || skippedAt == nil || publishedAt == nil || ops != 1 {
		t.Fatalf("skip recorded by %q, reason %q, at %v (published_at %v), %d operations", by, reason, skippedAt, publishedAt, ops)
	}
	_, stderr, code = runOutbox(t, nil, "quarantine", "skip", poison.String(), "--schema", schema, "--reason", "again")
	if code != 1 || !strings.Contains(stderr, "is not quarantined: it is skipped") {
		t.Fatalf("second skip: exit %d, %s", code, stderr)
	}

	stdout, stderr, code = runOutbox(t, nil, "quarantine", "retry", flaky.String(), "--schema", schema, "--json")
	if code != 0 {
		t.Fatalf("retry: exit %d: %s", code, stderr)
	}
	var retried outbox.EventInfo
	if err := json.Unmarshal([]byte(stdout), &retried); err != nil || retried.Attempts != 20 {
		t.Fatalf("retry output %q (%v): want the event as it was", stdout, err)
	}
	var attempts int
	var quarantined *time.Time
	var due bool
	if err := pool.QueryRow(ctx, `SELECT attempt_count, quarantined_at, available_at <= now() FROM `+schema+`.outbox_events WHERE event_id = $1`, flaky).Scan(&attempts, &quarantined, &due); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || quarantined != nil || !due {
		t.Fatalf("after retry: attempts %d, quarantined %v, due %v; want 0, nil, true", attempts, quarantined, due)
	}
	stdout, _, _ = runOutbox(t, nil, "quarantine", "list", "--schema", schema)
	if strings.TrimSpace(stdout) != "no quarantined events" {
		t.Fatalf("list after skip and retry: %q", stdout)
	}
}

// seedForCleanup writes old settled events, protected rows and inbox rows;
// it returns the protected event ids.
func seedForCleanup(t *testing.T, pool *pgxpool.Pool, schema string, old int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, published_at)
		SELECT gen_random_uuid(), 'order', 'old-' || i, 1, 'Old', '{}', now() - interval '2 hours' - i * interval '1 second' FROM generate_series(1, $1) i`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.processed_events (consumer_name, event_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '3 hours' FROM generate_series(1, $1)`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.processed_events (consumer_name, event_id, processed_at) VALUES ('c', gen_random_uuid(), now())`); err != nil {
		t.Fatal(err)
	}
	// Consumer c's high-water mark: clean-up keeps it, and a relay's
	// metrics report c's inbox (aggregates waiting on a gap: none).
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.inbox_aggregates (consumer_name, aggregate_type, aggregate_id, last_sequence) VALUES ('c', 'order', 'old-1', 1)`); err != nil {
		t.Fatal(err)
	}
	return []uuid.UUID{
		insertEvent(t, pool, schema, "recent", 1, "published_at = now() - interval '5 minutes'"),
		insertEvent(t, pool, schema, "stuck", 1, "occurred_at = now() - interval '30 days'"),
		insertEvent(t, pool, schema, "poison", 1, "occurred_at = now() - interval '30 days', quarantined_at = now() - interval '29 days'"),
		insertEvent(t, pool, schema, "skipped", 1, "quarantined_at = now() - interval '1 day', published_at = now() - interval '10 minutes', skipped_at = now() - interval '10 minutes', skipped_by = 'x', skip_reason = 'y', skipped_from = 1"),
	}
}

func cleanupState(t *testing.T, pool *pgxpool.Pool, schema string, protected []uuid.UUID) (oldEvents, oldInbox int) {
	t.Helper()
	var kept, recentInbox int
	if err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM `+schema+`.outbox_events WHERE event_id = ANY($1)),
		(SELECT count(*) FROM `+schema+`.outbox_events WHERE aggregate_id LIKE 'old-%'),
		(SELECT count(*) FROM `+schema+`.processed_events WHERE processed_at > now() - interval '1 hour'),
		(SELECT count(*) FROM `+schema+`.processed_events WHERE processed_at < now() - interval '1 hour')`, protected).Scan(&kept, &oldEvents, &recentInbox, &oldInbox); err != nil {
		t.Fatal(err)
	}
	if kept != len(protected) || recentInbox != 1 {
		t.Fatalf("clean-up deleted protected rows: %d of %d unpublished/quarantined/in-horizon events left, %d of 1 recent inbox rows", kept, len(protected), recentInbox)
	}
	return oldEvents, oldInbox
}

// TestCleanupCommandSurvivesACrashMidBatch kills the clean-up with SIGKILL
// between a batch's DELETE and its COMMIT (the cleanup/mid-batch failpoint
// on its third batch): the two committed batches are gone, the third is
// rolled back, nothing protected was touched; a rerun finishes the job.
func TestCleanupCommandSurvivesACrashMidBatch(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	protected := seedForCleanup(t, pool, schema, 35)
	args := []string{"cleanup", "--schema", schema, "--older-than", "1h", "--inbox-older-than", "1h", "--batch-size", "10"}

	_, stderr, code := runOutbox(t, []string{"OUTBOX_FAILPOINTS=cleanup/mid-batch=crash@3"}, args...)
	if code != -int(syscall.SIGKILL) {
		t.Fatalf("clean-up with the crash failpoint: exit %d, want killed by SIGKILL; stderr:\n%s", code, stderr)
	}
	if oldEvents, oldInbox := cleanupState(t, pool, schema, protected); oldEvents != 15 || oldInbox != 35 {
		t.Fatalf("after the crash: %d old events and %d old inbox rows left, want 15 (two batches committed, the third rolled back) and 35", oldEvents, oldInbox)
	}

	stdout, stderr, code := runOutbox(t, nil, args...)
	if code != 0 || !strings.Contains(stdout, "deleted 15 settled events older than 1h0m0s and 35 inbox rows") || !strings.Contains(stderr, "rows deleted so far") {
		t.Fatalf("rerun: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if oldEvents, oldInbox := cleanupState(t, pool, schema, protected); oldEvents != 0 || oldInbox != 0 {
		t.Fatalf("after the rerun: %d old events and %d old inbox rows left", oldEvents, oldInbox)
	}
	stdout, _, code = runOutbox(t, nil, append(args, "--json")...)
	var res struct {
		EventsDeleted *int64 `json:"events_deleted"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || code != 0 || res.EventsDeleted == nil || *res.EventsDeleted != 0 {
		t.Fatalf("third run: exit %d, %q (%v): want nothing left to delete", code, stdout, err)
	}
}

// TestReplayCommand publishes events, then replays one aggregate and a time
// range from the command line and reads them back from the stream.
func TestReplayCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	js := natstest.JetStream(t, natstest.Conn(t))
	pub := natstest.Publisher(t, js, outboxnats.Config{DuplicateWindow: time.Hour})
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var recs []outbox.Recorded
	for round := 0; round < 5; round++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, agg := range []string{"o1", "o2", "o3"} {
				r, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, Type: fmt.Sprintf("Step%d", round), Payload: []byte(`{}`)})
				if err != nil {
					return err
				}
				recs = append(recs, r...)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	outboxtest.Eventually(t, 30*time.Second, "all published", func() bool { return relay.Stats().Published == 15 })
	stop()
	<-done

	stream, err := js.Stream(ctx, pub.Stream())
	if err != nil {
		t.Fatal(err)
	}
	readFrom := func(from uint64) []outbox.Message {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []outbox.Message
		for seq := from; seq <= info.State.LastSeq; seq++ {
			raw, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			m, err := outboxnats.Decode(raw.Header, raw.Data)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	original := map[uuid.UUID]outbox.Message{}
	for _, m := range readFrom(1) {
		original[m.ID] = m
	}
	dest := []string{"--schema", schema, "--destination", outboxtest.NATSURL(), "--nats-stream", pub.Stream(), "--nats-subject-prefix", pub.SubjectPrefix()}

	stdout, _, code := runOutbox(t, nil, append([]string{"replay", "--aggregate-id", "o2", "--dry-run"}, dest...)...)
	if code != 0 || strings.TrimSpace(stdout) != "5 events would be replayed" {
		t.Fatalf("dry run: exit %d, %q", code, stdout)
	}
	since := recs[3*3].OccurredAt.Format(time.RFC3339Nano) // rounds 3 and 4
	for _, c := range []struct {
		args []string
		want map[string][]int64
	}{
		{[]string{"--aggregate-type", "order", "--aggregate-id", "o2", "--batch-size", "2"}, map[string][]int64{"o2": {1, 2, 3, 4, 5}}},
		{[]string{"--since", since}, map[string][]int64{"o1": {4, 5}, "o2": {4, 5}, "o3": {4, 5}}},
	} {
		next := uint64(len(readFrom(1))) + 1
		stdout, stderr, code := runOutbox(t, nil, append(append([]string{"replay"}, c.args...), dest...)...)
		if code != 0 || !strings.Contains(stdout, "events of") || !strings.Contains(stderr, "events (100%)") {
			t.Fatalf("replay %v: exit %d\nstdout: %s\nstderr: %s", c.args, code, stdout, stderr)
		}
		got := map[string][]int64{}
		var replayID uuid.UUID
		for _, m := range readFrom(next) {
			o, ok := original[m.ID]
			if !ok || o.Sequence != m.Sequence || o.AggregateID != m.AggregateID || o.Type != m.Type {
				t.Fatalf("replayed message %+v is not an original event", m)
			}
			if replayID == uuid.Nil {
				replayID = m.ReplayID
			}
			if m.ReplayID == uuid.Nil || m.ReplayID != replayID {
				t.Fatalf("replayed message %s has replay id %s, want one shared non-zero id", m.ID, m.ReplayID)
			}
			got[m.AggregateID] = append(got[m.AggregateID], m.Sequence)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Fatalf("replay %v reached the stream as %v, want %v (per-aggregate order, original ids)", c.args, got, c.want)
		}
	}
}

// latestMigration is the version of the newest embedded migration.
func latestMigration() int {
	all := outboxmigrate.All()
	return all[len(all)-1].Version
}
