package outboxfleet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// published returns outbox_published_total by source label.
func publishedBySource(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "outbox_published_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[label(m, "source")] += m.GetCounter().GetValue()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestFleetMetricsBySource: every source's series carry its source label,
// count its own events, and go when its schema is dropped.
func TestFleetMetricsBySource(t *testing.T) {
	t.Parallel()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "m")
	a, b := prefix+"_a", prefix+"_b"
	migrateSchemas(t, admin, a, b)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s}
databases:
  main: {url: %q, max_conns: 3}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: main, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}), Registerer: reg})
	waitFor(t, 3*time.Minute, "2 sources running", func() bool { return len(running(f)) == 2 })
	var w written
	w.write(t, admin, a, "order", 3, 2) // 6 events
	w.write(t, admin, b, "order", 2, 2) // 4 events
	srcA, srcB := "main/"+a, "main/"+b
	waitFor(t, 60*time.Second, "published counted per source", func() bool {
		p := publishedBySource(t, reg)
		return p[srcA] == 6 && p[srcB] == 4
	})
	if _, err := admin.Exec(t.Context(), "DROP SCHEMA "+b+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "the dropped source's series gone", func() bool {
		p := publishedBySource(t, reg)
		_, has := p[srcB]
		return !has && p[srcA] == 6
	})
}
