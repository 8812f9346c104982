package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestSideEffectCommands lists a parked attempt, shows it, resolves it as
// succeeded with who and why, and refuses what cannot be resolved.
func TestSideEffectCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	c, err := sideeffect.New(pool, sideeffect.Config{Name: "mail.send", Schema: schema, Mode: sideeffect.Neither})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, string) ([]byte, error) { return []byte(`{"id":"m1"}`), nil }
	lost := func(context.Context, string) ([]byte, error) { return nil, errors.New("connection reset by peer") }
	if _, err := c.Do(ctx, "evt-1", nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "evt-1", nil, ok); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "evt-2", nil, ok); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, code := runOutbox(t, nil, "sideeffect", "parked", "--schema", schema)
	for _, want := range []string{"mail.send", "evt-1", "neither idempotency keys nor a lookup", "connection reset by peer"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("parked lacks %q (exit %d, %s):\n%s", want, code, stderr, stdout)
		}
	}
	// An event waits on the parked attempt: show names it.
	eventID := uuid.New()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return c.WaitTx(ctx, tx, sideeffect.Wait{Consumer: "mailer", Key: "evt-1", Message: outbox.Message{ID: eventID,
			AggregateType: "user", AggregateID: "u1", Sequence: 3, Type: "UserInvited", Payload: []byte(`{}`)}})
	}); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = runOutbox(t, nil, "sideeffect", "show", "--schema", schema, "--name", "mail.send", "--key", "evt-1")
	if code != 0 || !strings.Contains(stdout, "parked (mode neither)") || !strings.Contains(stdout, "calls          1") ||
		!strings.Contains(stdout, "waiting        consumer mailer: event "+eventID.String()+" (UserInvited, user u1 #3)") {
		t.Fatalf("show (exit %d):\n%s", code, stdout)
	}
	stdout, _, code = runOutbox(t, nil, "sideeffect", "show", "--schema", schema, "--name", "mail.send", "--key", "evt-1", "--json")
	var shown struct {
		State   sideeffect.State          `json:"state"`
		Waiting []sideeffect.WaitingEvent `json:"waiting"`
	}
	if err := json.Unmarshal([]byte(stdout), &shown); code != 0 || err != nil || shown.State != sideeffect.Parked ||
		len(shown.Waiting) != 1 || shown.Waiting[0].EventID != eventID.String() || shown.Waiting[0].Consumer != "mailer" {
		t.Fatalf("show --json (exit %d, %v):\n%s", code, err, stdout)
	}
	_, stderr, code = runOutbox(t, nil, "sideeffect", "resolve", "--schema", schema, "--name", "mail.send", "--key", "evt-1", "--as", "succeeded")
	if code != 2 || !strings.Contains(stderr, "--reason is required") {
		t.Fatalf("resolve without reason: exit %d: %s", code, stderr)
	}
	stdout, stderr, code = runOutbox(t, nil, "sideeffect", "resolve", "--schema", schema, "--name", "mail.send", "--key", "evt-1",
		"--as", "succeeded", "--response", `{"id":"m1"}`, "--reason", "message m1 in the mail provider's log", "--json")
	if code != 0 {
		t.Fatalf("resolve: exit %d: %s", code, stderr)
	}
	var a sideeffect.Attempt
	if err := json.Unmarshal([]byte(stdout), &a); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if a.State != sideeffect.Succeeded || a.Via != "operator" || a.Operator == nil || a.Operator.By != "tester" || string(a.Response) != `{"id":"m1"}` {
		t.Fatalf("resolved %+v", a)
	}
	if res, err := c.Do(ctx, "evt-1", nil, lost); err != nil || !res.Replayed || res.State != sideeffect.Succeeded {
		t.Fatalf("Do after resolve: %+v, %v", res, err)
	}
	_, stderr, code = runOutbox(t, nil, "sideeffect", "resolve", "--schema", schema, "--name", "mail.send", "--key", "evt-2", "--as", "retry", "--reason", "x")
	if code != 1 || !strings.Contains(stderr, "is final already") {
		t.Fatalf("resolve a final attempt: exit %d: %s", code, stderr)
	}
	_, stderr, code = runOutbox(t, nil, "sideeffect", "show", "--schema", schema, "--name", "mail.send", "--key", "nope")
	if code != 1 || !strings.Contains(stderr, "no such attempt") {
		t.Fatalf("show a missing attempt: exit %d: %s", code, stderr)
	}
	if stdout, _, code = runOutbox(t, nil, "sideeffect", "parked", "--schema", schema); code != 0 || !strings.Contains(stdout, "no parked attempts") {
		t.Fatalf("parked after resolve (exit %d):\n%s", code, stdout)
	}
}
