package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestSagaStatusJSON runs `orders saga status --json` against a schema with
// sagas in several states: one JSON document, snake_case keys, every state
// counted (0 included) and the sagas needing attention oldest first with
// their reason (issue 22, item 12).
func TestSagaStatusJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(ordersBinary(t), append([]string{"saga", "status", "--schema", schema}, args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL())
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("orders saga status %v: %v: %s", args, err, stderr.String())
		}
		return string(out)
	}
	run() // creates the order service's tables
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.order_sagas (order_id, state, reason, attention_since) VALUES
		('o1', 'confirmed', NULL, NULL), ('o2', 'confirmed', NULL, NULL), ('o3', 'cancelled', 'customer', NULL),
		('o4', 'needs_attention', 'refund failed: card closed', now() - interval '2 hours'),
		('o5', 'needs_attention', 'refund outcome unknown: timeout', now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	out := run("--json")
	var st struct {
		Counts         map[string]int64 `json:"counts"`
		NeedsAttention []struct {
			OrderID string    `json:"order_id"`
			Since   time.Time `json:"since"`
			Reason  string    `json:"reason"`
		} `json:"needs_attention"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil || dec.More() {
		t.Fatalf("not one JSON document of the documented keys (%v):\n%s", err, out)
	}
	want := map[string]int64{"started": 0, "stock_reserved": 0, "confirmed": 2, "cancelled": 1, "needs_attention": 2}
	for k, v := range want {
		if n, ok := st.Counts[k]; !ok || n != v {
			t.Errorf("counts[%s] = %d (present %v), want %d", k, n, ok, v)
		}
	}
	if len(st.NeedsAttention) != 2 || st.NeedsAttention[0].OrderID != "o4" || st.NeedsAttention[0].Reason != "refund failed: card closed" ||
		st.NeedsAttention[1].OrderID != "o5" || time.Since(st.NeedsAttention[0].Since) < 110*time.Minute {
		t.Errorf("needs_attention %+v", st.NeedsAttention)
	}
	if text := run(); !strings.Contains(text, "needs attention: order o4 since") || !strings.Contains(text, "confirmed        2") {
		t.Errorf("text output:\n%s", text)
	}
	cmd := exec.Command(ordersBinary(t), "saga", "status", "--help")
	help, _ := cmd.CombinedOutput()
	if !strings.Contains(string(help), "--json") {
		t.Errorf("orders saga status --help does not document --json:\n%s", help)
	}
}
