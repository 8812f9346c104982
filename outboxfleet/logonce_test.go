package outboxfleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// TestFleetLogsADestinationsAcknowledgementOnce: every source's relay checks
// its destination's acknowledgement at start; with many sources on one
// destination the fleet logs the finding once, not once per source, while
// every relay still records it in its heartbeat row (outbox status).
func TestFleetLogsADestinationsAcknowledgementOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "ack")
	const n = 6
	var schemas []string
	for i := 0; i < n; i++ {
		schemas = append(schemas, fmt.Sprintf("%s_%d", prefix, i))
	}
	migrateSchemas(t, admin, schemas...)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay:
  poll_interval: 50ms
  discover_interval: 200ms
databases:
  main:
    url: %q
destinations:
  events:
    url: nats://unused
sources:
  - database: main
    schema_pattern: "%s_*"
    destination: events
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	logs := &outboxtest.Buffer{}
	runFleet(t, cfg, outboxfleet.Options{
		OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}),
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
	})
	waitFor(t, time.Minute, "every source's relay recorded its destination's acknowledgement", func() bool {
		for _, s := range schemas {
			var recorded bool
			if err := admin.QueryRow(ctx, `SELECT count(*) > 0 FROM `+s+`.outbox_relays WHERE ack_durability IS NOT NULL`).Scan(&recorded); err != nil || !recorded {
				return false
			}
		}
		return true
	})
	if got := strings.Count(logs.String(), `msg="destination acknowledgement `); got != 1 {
		t.Fatalf("%d log lines on the destination's acknowledgement for %d sources, want 1:\n%s", got, n, logs.String())
	}
}
