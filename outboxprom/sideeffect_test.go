package outboxprom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxprom"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestSideEffectMetrics: calls by outcome, blind retries, replays, parks
// and lookups are counted per name; the open attempts by state and the
// oldest unknown age are sampled from the database.
func TestSideEffectMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	m, err := outboxprom.New(outboxprom.Config{Schema: schema, SideEffects: admin, GaugesMaxAge: time.Nanosecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	scrape := func() map[string]*dto.MetricFamily {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		return byName
	}
	newCaller := func(cfg sideeffect.Config) *sideeffect.Caller {
		cfg.Schema, cfg.Observer = schema, m
		c, err := sideeffect.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ok := func(context.Context, string) ([]byte, error) { return []byte(`{}`), nil }
	lost := func(context.Context, string) ([]byte, error) { return nil, errors.New("i/o timeout") }

	// Mode neither, blind retries: one unknown, then a blind call.
	mail := newCaller(sideeffect.Config{Name: "mail", Mode: sideeffect.Neither, BlindRetry: true})
	if _, err := mail.Do(ctx, "k1", nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := mail.Do(ctx, "k1", nil, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := mail.Do(ctx, "k1", nil, ok); err != nil { // replayed
		t.Fatal(err)
	}
	// Mode queryable: one unknown left, one found by lookup, one parked.
	found := map[string]bool{"k2": true}
	pay := newCaller(sideeffect.Config{Name: "pay", Mode: sideeffect.Queryable, MaxChecks: 1,
		Lookup: sideeffect.LookupFunc(func(_ context.Context, key string) (sideeffect.LookupResult, error) {
			return sideeffect.LookupResult{Found: found[key]}, nil
		})})
	for _, k := range []string{"k1", "k2", "k3"} {
		if _, err := pay.Do(ctx, k, nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
			t.Fatal(err)
		}
	}
	if _, err := pay.Do(ctx, "k2", nil, ok); err != nil { // looked up, found
		t.Fatal(err)
	}
	// Not found, called, lost again: past MaxChecks, parked.
	if _, err := pay.Do(ctx, "k3", nil, lost); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatalf("k3: %v, want parked", err)
	}
	if _, err := pay.Do(ctx, "k3", nil, ok); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatalf("k3 again: %v, want parked", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.side_effects SET unknown_since = now() - interval '10 minutes' WHERE name = 'pay' AND key = 'k1'`); err != nil {
		t.Fatal(err)
	}

	fams := scrape()
	l := func(kv ...string) map[string]string {
		out := map[string]string{"schema": schema}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	for _, c := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"sideeffect_calls_total", l("name", "mail", "outcome", "unknown"), 1},
		{"sideeffect_calls_total", l("name", "mail", "outcome", "succeeded"), 1},
		{"sideeffect_blind_retries_total", l("name", "mail"), 1},
		{"sideeffect_replays_total", l("name", "mail"), 1},
		{"sideeffect_calls_total", l("name", "pay", "outcome", "unknown"), 4},
		{"sideeffect_reconciliations_total", l("name", "pay", "result", "succeeded"), 1},
		{"sideeffect_reconciliations_total", l("name", "pay", "result", "not_found"), 1},
		{"sideeffect_parked_total", l("name", "pay"), 1},
		{"sideeffect_blind_retries_total", l("name", "pay"), 0},
		{"sideeffect_attempts", l("name", "pay", "state", "unknown"), 1},
		{"sideeffect_attempts", l("name", "pay", "state", "parked"), 1},
		{"sideeffect_attempts", l("name", "pay", "state", "started"), 0},
		{"sideeffect_attempts", l("name", "mail", "state", "unknown"), 0},
		{"sideeffect_oldest_unknown_age_seconds", l("name", "mail"), 0},
	} {
		if got := value(t, fams, c.metric, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.metric, c.labels, got, c.want)
		}
	}
	if got := value(t, fams, "sideeffect_oldest_unknown_age_seconds", l("name", "pay")); got < 590 || got > 700 {
		t.Errorf("sideeffect_oldest_unknown_age_seconds{pay} = %g, want about 600", got)
	}
}
