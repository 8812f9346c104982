package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
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

// nulPublisher acknowledges every message but those fail refuses.
type nulPublisher struct {
	fail func(m outbox.Message) error
}

func (p nulPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	failed := false
	for i, m := range msgs {
		if errs[i] = p.fail(m); errs[i] != nil {
			failed = true
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// TestAdv22ADestinationsErrorOfAnyTextIsRecorded: a destination's error
// text is recorded as the event's last_error, in the settle transaction of
// the whole batch. A text PostgreSQL's text refuses (a NUL, as a webhook's
// protobuf error body quoted in the error holds; bytes that are not UTF-8;
// a multi-byte character cut at 2,000 bytes) failed that transaction: the
// batch's acknowledged events were not marked published either, the
// failure was never counted, and at every lease the batch was published
// again, for ever, the refused event never quarantined.
func TestAdv22ADestinationsErrorOfAnyTextIsRecorded(t *testing.T) {
	t.Parallel()
	for name, text := range map[string]string{
		"nul":         "endpoint answered 400: \x08\x96\x01\x00\x12",
		"latin1":      "endpoint answered 400: caf\xe9",
		"cut-in-rune": strings.Repeat("a", 1999) + "é and the rest",
		// Two-byte characters throughout: the cut at 2,000 bytes lands
		// inside one whatever prefix the relay puts before the text, unless
		// the prefix is of an even length; three-byte ones for that case.
		"cut-in-rune-2": strings.Repeat("é", 1500),
		"cut-in-rune-3": "x" + strings.Repeat("€", 1000),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema := outboxtest.Schema(t)
			w := newWriter(t, schema)
			pub := nulPublisher{fail: func(m outbox.Message) error {
				if m.AggregateID == "agg-1" && m.Sequence == 1 {
					return outbox.Permanent(errors.New(text))
				}
				return nil
			}}
			writeEvents(t, pool, w, 3, 2)
			cfg := quietConfig(schema, pub)
			cfg.LeaseDuration = 2 * time.Second
			startRelay(t, pool, cfg)
			outboxtest.Eventually(t, 60*time.Second, "the other lanes published and agg-1's head quarantined", func() bool {
				var pending, quarantined int
				err := pool.QueryRow(ctx0, `SELECT count(*) FILTER (WHERE published_at IS NULL AND aggregate_id <> 'agg-1'),
	count(*) FILTER (WHERE quarantined_at IS NOT NULL)
FROM `+schema+`.outbox_events`).Scan(&pending, &quarantined)
				return err == nil && pending == 0 && quarantined == 1
			})
		})
	}
}

var ctx0 = context.Background()

// TestAdv22ARelayHealthOfAnOutageWithANulIsRecorded: the relay records
// its /readyz reason in its heartbeat row as JSON; a reason holding a NUL
// (the destination's error text) is "\u0000" in JSON, which jsonb refuses:
// the health was not recorded (a debug line), and the console and `outbox
// status` went on showing the relay's last health, "ready", through the
// outage.
func TestAdv22ARelayHealthOfAnOutageWithANulIsRecorded(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	pub := nulPublisher{fail: func(m outbox.Message) error {
		return outbox.Unavailable(errors.New("broker closed the connection: \x00\x01"))
	}}
	writeEvents(t, pool, w, 1, 1)
	cfg := quietConfig(schema, pub)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 60*time.Second, "the relay's health recorded as not ready", func() bool {
		var ready *bool
		err := pool.QueryRow(ctx0, `SELECT (health->>'ready')::boolean FROM `+schema+`.outbox_relays`).Scan(&ready)
		return err == nil && ready != nil && !*ready
	})
}
