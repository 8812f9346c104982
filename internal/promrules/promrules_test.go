package promrules

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestSeries(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]string{
		`max by (schema) (outbox_oldest_pending_age_seconds) > 300`:                                           "[outbox_oldest_pending_age_seconds]",
		`absent(outbox_relay_up == 1) or max by (schema) (outbox_relays_alive) < 1`:                           "[outbox_relay_up outbox_relays_alive]",
		`sum by (schema) (increase(outbox_expired_claims_total[15m])) > 0`:                                    "[outbox_expired_claims_total]",
		`sum(rate(outbox_failures_total{reason="unavailable", x=~"a}b"}[5m])) without (reason) offset 5m > 0`: "[outbox_failures_total]",
		`histogram_quantile(0.99, sum by (le) (rate(x_bucket{schema=~"$schema"}[$__rate_interval])))`:         "[x_bucket]",
		`a / on (schema) group_left (table) b unless bool c`:                                                  "[a b c]",
	} {
		got, err := Series(expr)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("Series(%s) = %v, %v; want %s", expr, got, err, want)
		}
	}
	if _, err := Series(`max(x{a="b"`); err == nil {
		t.Error("unbalanced braces accepted")
	}
}

const scrape = `# TYPE g gauge
g{schema="a"} 10
g{schema="b"} 400
# TYPE c counter
c_total{schema="a",reason="x"} 3
`

func TestEval(t *testing.T) {
	t.Parallel()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	for expr, want := range map[string]string{
		`max by (schema) (g) > 300`:     "[{map[schema:b] 400}]",
		`max(g) > 300`:                  "[{map[] 400}]",
		`max(g{schema="a"}) > 300`:      "[]",
		`sum(g)`:                        "[{map[] 410}]",
		`count(g) == 2`:                 "[{map[] 2}]",
		`min(g) without (schema) < 11`:  "[{map[] 10}]",
		`g > 5`:                         "[{map[schema:a] 10} {map[schema:b] 400}]",
		`c_total{reason="x"} >= 3`:      "[{map[reason:x schema:a] 3}]",
		`max by (schema) (missing) > 0`: "[]",
	} {
		got, err := Eval(expr, fams)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("Eval(%s) = %v, %v; want %s", expr, got, err, want)
		}
	}
	for _, bad := range []string{`rate(c_total[5m]) > 0`, `g > x`, `max(g) > 1 and g`} {
		if _, err := Eval(bad, fams); err == nil {
			t.Errorf("Eval(%s) accepted", bad)
		}
	}
}
