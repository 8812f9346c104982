package outboxprom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxprom"
)

// TestDestinationGauges: what a relay makes of its destination
// (outbox.DestinationObserver) is exported once a relay reported, and the
// shipped alerts on it fire from those values.
func TestDestinationGauges(t *testing.T) {
	t.Parallel()
	m, err := outboxprom.New(outboxprom.Config{Schema: "s"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	gather := func() map[string]*dto.MetricFamily {
		list, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		fams := map[string]*dto.MetricFamily{}
		for _, f := range list {
			fams[f.GetName()] = f
		}
		return fams
	}
	exported := func() map[string]bool { return promrules.Exported(gather()) }
	if got := exported(); got["outbox_destination_unavailable"] || got["outbox_destination_refused_routes"] {
		t.Fatal("destination gauges exported before any relay reported")
	}
	groups, err := promrules.Load("../deploy/prometheus/outbox-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]string{}
	for _, g := range groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
		}
	}
	for _, tc := range []struct {
		o           outbox.DestinationObservation
		unavailable bool
		refused     bool
	}{
		{outbox.DestinationObservation{}, false, false},
		{outbox.DestinationObservation{Unavailable: true}, true, false},
		{outbox.DestinationObservation{RefusedRoutes: 2}, false, true},
	} {
		m.ObserveDestination(tc.o)
		fams := gather()
		s := map[string]string{"schema": "s"}
		if v, ok := promrules.Value(fams, "outbox_destination_unavailable", s); !ok || (v == 1) != tc.unavailable {
			t.Errorf("%+v: outbox_destination_unavailable = %g (found %t)", tc.o, v, ok)
		}
		if v, ok := promrules.Value(fams, "outbox_destination_refused_routes", s); !ok || v != float64(tc.o.RefusedRoutes) {
			t.Errorf("%+v: outbox_destination_refused_routes = %g (found %t)", tc.o, v, ok)
		}
		for name, want := range map[string]bool{"OutboxDestinationUnavailable": tc.unavailable, "OutboxRouteRefused": tc.refused} {
			got, err := promrules.Eval(alerts[name], fams)
			if err != nil {
				t.Fatalf("alert %s: %v", name, err)
			}
			if (len(got) == 1) != want {
				t.Errorf("%+v: alert %s evaluated to %v, want firing %t", tc.o, name, got, want)
			}
		}
	}
}
