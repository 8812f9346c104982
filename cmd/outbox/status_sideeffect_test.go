package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestStatusShowsSideEffects: `outbox status` shows a consumer's side-effect
// attempts (counts by state, the parked ones with their reason), from the
// outbox's schema or from --sideeffect-schema, in text and JSON; a schema
// without attempts adds nothing, a named schema without the table is an
// error.
func TestStatusShowsSideEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, plain := outboxtest.Schema(t)
	pool, consumer := outboxtest.SchemaNamed(t, outboxtest.UniqueName(t, "c"))
	c, err := sideeffect.New(pool, sideeffect.Config{Name: "payments.charge", Schema: consumer, Mode: sideeffect.Neither})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, string) ([]byte, error) { return []byte(`{}`), nil }
	lost := func(context.Context, string) ([]byte, error) { return nil, errors.New("i/o timeout") }
	if _, err := c.Do(ctx, "evt-1", nil, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "evt-2", nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "evt-2", nil, ok); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatal(err)
	}

	stdout, stderr, code := runOutbox(t, nil, "status", "--schema", plain)
	if code != 0 || strings.Contains(stdout, "side effects") {
		t.Fatalf("status of a schema without attempts (exit %d, %s):\n%s", code, stderr, stdout)
	}
	stdout, stderr, code = runOutbox(t, nil, "status", "--schema", plain, "--sideeffect-schema", consumer)
	for _, want := range []string{"side effects (schema " + consumer + ")", "payments.charge", "evt-2", "neither idempotency keys nor a lookup"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("status lacks %q (exit %d, %s):\n%s", want, code, stderr, stdout)
		}
	}
	stdout, stderr, code = runOutbox(t, []string{"OUTBOX_SIDEEFFECT_SCHEMA=" + consumer}, "status", "--schema", plain, "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d: %s", code, stderr)
	}
	var st struct {
		Schema      string             `json:"schema"`
		SideEffects *sideeffect.Status `json:"side_effects"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	se := st.SideEffects
	if st.Schema != plain || se == nil || len(se.Names) != 1 || se.Names[0].Succeeded != 1 || se.Names[0].Parked != 1 ||
		len(se.Parked.Attempts) != 1 || se.Parked.Attempts[0].Key != "evt-2" {
		t.Fatalf("status --json: %s", stdout)
	}
	// The consumer's own schema shows its attempts without the flag.
	if stdout, _, code = runOutbox(t, nil, "status", "--schema", consumer); code != 0 || !strings.Contains(stdout, "payments.charge") {
		t.Fatalf("status --schema %s (exit %d):\n%s", consumer, code, stdout)
	}
	_, stderr, code = runOutbox(t, nil, "status", "--schema", plain, "--sideeffect-schema", "no_such_schema_x")
	if code != 1 || !strings.Contains(stderr, "has no side-effect table") {
		t.Fatalf("unknown side-effect schema: exit %d: %s", code, stderr)
	}
}
