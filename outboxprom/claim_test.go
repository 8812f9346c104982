package outboxprom_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxprom"
)

// TestFullScansApartFromClaims: a background full scan's time, which grows
// with the dead entries a held xmin keeps, is recorded as
// statement="full_scan", apart from the claims, whose round trips it would
// otherwise swamp (one 20 s scan beside 3,000 claims of 13 ms a minute
// raises their mean by half).
func TestFullScansApartFromClaims(t *testing.T) {
	t.Parallel()
	m, err := outboxprom.New(outboxprom.Config{Schema: "s"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	m.ObserveClaim(outbox.ClaimObservation{Events: 10, Duration: 10 * time.Millisecond})
	m.ObserveClaim(outbox.ClaimObservation{Events: 10, Duration: 20 * time.Millisecond})
	m.ObserveClaim(outbox.ClaimObservation{Duration: 20 * time.Second, FullScan: true})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]float64{}
	for _, f := range fams {
		if f.GetName() != "outbox_db_statement_seconds" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "statement" {
					got[l.GetValue()] = [2]float64{float64(mt.GetHistogram().GetSampleCount()), mt.GetHistogram().GetSampleSum()}
				}
			}
		}
	}
	if c := got["claim"]; c[0] != 2 || c[1] < 0.029 || c[1] > 0.031 {
		t.Errorf("claim: count %v, sum %v s; want 2 claims, 0.03 s", c[0], c[1])
	}
	if f := got["full_scan"]; f[0] != 1 || f[1] != 20 {
		t.Errorf("full_scan: count %v, sum %v s; want 1 scan, 20 s", f[0], f[1])
	}
}
