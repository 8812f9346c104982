package outbox_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdv22ARelayHealthNotOfTheShapeDoesNotBlankTheStatus: a relay's
// heartbeat row is written by the relay role (and by relays of other
// versions); health and ack_durability that are JSON but not of the shape
// this version reads ("ready" as a string, an array, a bare string) made
// Admin.Status fail as a whole, so `outbox status`, `status --check` and
// the console's overview showed an error instead of the outbox, because of
// one row's monitoring note. Admin.History already skips unreadable
// minutes. Status must answer, with that relay's health left unknown.
func TestAdv22ARelayHealthNotOfTheShapeDoesNotBlankTheStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	a := newAdmin(t, pool, schema)
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_relays (relay_id, expires_at, health, ack_durability) VALUES
	('good', now() + interval '30 seconds', '{"ready": true}', NULL),
	('odd1', now() + interval '30 seconds', '{"ready": "yes", "minutes": 3}', NULL),
	('odd2', now() + interval '30 seconds', '"not ready: <script>alert(1)</script>"', '[1,2]')`); err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatalf("Status with one relay's health not of the shape: %v", err)
	}
	if len(st.Relays) != 3 {
		t.Fatalf("Status lists %d relays, want 3", len(st.Relays))
	}
	for _, r := range st.Relays {
		if r.ID == "good" && (r.Health == nil || !r.Health.Ready) {
			t.Fatalf("the readable relay's health was lost: %+v", r.Health)
		}
	}
	if _, err := a.History(ctx); err != nil {
		t.Fatalf("History: %v", err)
	}
}
