// Package promrules lets tests check the shipped Prometheus alert rules and
// Grafana dashboard against what a relay really exports: it loads rule
// files, lists the series a PromQL expression reads, scrapes an endpoint,
// and evaluates the simple threshold expressions the rules use (an
// aggregation over a selector compared with a number) against one scrape.
//
// It is not a PromQL engine: Series understands the whole syntax well enough
// to find metric names, Eval only the subset documented on it.
package promrules

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v2"
)

// Rule is one alerting rule.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// Group is a rule group.
type Group struct {
	Name  string `yaml:"name"`
	Rules []Rule `yaml:"rules"`
}

// Load reads a Prometheus rule file.
func Load(path string) ([]Group, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Groups []Group `yaml:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f.Groups, nil
}

// DashboardExprs returns every "expr" of a Grafana dashboard JSON file's
// panel targets.
func DashboardExprs(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if e, ok := x["expr"].(string); ok {
				out = append(out, e)
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(doc)
	return out, nil
}

var keywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true, "inf": true, "nan": true,
	// aggregation operators, which may be followed by a grouping before "("
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}
func isIdent(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }

// Series returns the metric names a PromQL expression reads, sorted and
// without duplicates. Label matchers, label lists, ranges, strings,
// numbers, functions and keywords are skipped; a Grafana variable such as
// $__rate_interval is treated as a range.
func Series(expr string) ([]string, error) {
	seen := map[string]bool{}
	s := expr
	skipGroup := func(i int, open, close byte) (int, error) {
		depth := 0
		for ; i < len(s); i++ {
			switch c := s[i]; {
			case c == '"' || c == '\'' || c == '`':
				j := strings.IndexByte(s[i+1:], c)
				if j < 0 {
					return 0, fmt.Errorf("unterminated string in %q", expr)
				}
				i += j + 1
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unbalanced %c in %q", open, expr)
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unterminated string in %q", expr)
			}
			i += j + 2
		case c == '{':
			j, err := skipGroup(i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := skipGroup(i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
		case '0' <= c && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n') {
				k++
			}
			switch {
			case labelListKeywords[strings.ToLower(word)] && k < len(s) && s[k] == '(':
				end, err := skipGroup(k, '(', ')')
				if err != nil {
					return nil, err
				}
				i = end
				continue
			case keywords[strings.ToLower(word)]:
			case k < len(s) && s[k] == '(': // a function or an aggregation
			default:
				seen[word] = true
			}
			i = j
		default:
			i++
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// Scrape fetches url (a /metrics endpoint) and parses the text format.
func Scrape(url string) (map[string]*dto.MetricFamily, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(resp.Body)
}

// Exported returns the names of the series a scrape holds, the way PromQL
// sees them: a histogram or summary family "x" gives x_bucket, x_sum and
// x_count (and x for summaries' quantiles).
func Exported(families map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for name, f := range families {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
		default:
			out[name] = true
		}
	}
	return out
}

// Sample is one element of an instant vector.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Value returns the value of the single sample of the family name whose
// labels include want, and whether there was exactly one.
func Value(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	samples := selectSamples(families, name, want)
	if len(samples) != 1 {
		return 0, false
	}
	return samples[0].Value, true
}

func selectSamples(families map[string]*dto.MetricFamily, name string, want map[string]string) []Sample {
	f := families[name]
	if f == nil {
		return nil
	}
	var out []Sample
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			if labels[k] != v {
				ok = false
			}
		}
		if !ok {
			continue
		}
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		out = append(out, Sample{Labels: labels, Value: v})
	}
	return out
}

// Eval evaluates a threshold expression against one scrape and returns the
// samples it yields: for an alert rule, a non-empty result means it fires.
// The subset understood:
//
//	expr      = vector [ cmp number ]
//	vector    = selector | agg [ grouping ] "(" selector ")" [ grouping ]
//	agg       = "max" | "min" | "sum" | "count"
//	grouping  = ( "by" | "without" ) "(" label { "," label } ")"
//	selector  = metric [ "{" label "=" "string" { "," ... } "}" ]
//	cmp       = ">" | ">=" | "<" | "<=" | "==" | "!="
//
// Anything else (functions, ranges, binary operators between vectors) is an
// error.
func Eval(expr string, families map[string]*dto.MetricFamily) ([]Sample, error) {
	p := &parser{s: strings.TrimSpace(expr), expr: expr}
	vec, err := p.vector(families)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.done() {
		return vec, nil
	}
	op := p.cmp()
	if op == "" {
		return nil, p.errorf("expected a comparison")
	}
	p.space()
	num := p.word()
	threshold, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return nil, p.errorf("expected a number, got %q", num)
	}
	p.space()
	if !p.done() {
		return nil, p.errorf("unexpected %q", p.s[p.i:])
	}
	var out []Sample
	for _, s := range vec {
		if compare(op, s.Value, threshold) {
			out = append(out, s)
		}
	}
	return out, nil
}

func compare(op string, a, b float64) bool {
	switch op {
	case ">":
		return a > b
	case ">=":
		return a >= b
	case "<":
		return a < b
	case "<=":
		return a <= b
	case "==":
		return a == b
	}
	return a != b
}

type parser struct {
	s, expr string
	i       int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("promrules: %q at %d: %s (Eval understands only aggregation-over-selector thresholds)", p.expr, p.i, fmt.Sprintf(format, args...))
}

func (p *parser) done() bool { return p.i >= len(p.s) }

func (p *parser) space() {
	for !p.done() && strings.ContainsRune(" \t\n", rune(p.s[p.i])) {
		p.i++
	}
}

func (p *parser) word() string {
	j := p.i
	for j < len(p.s) && (isIdent(p.s[j]) || p.s[j] == '.' || p.s[j] == '-' && j == p.i) {
		j++
	}
	w := p.s[p.i:j]
	p.i = j
	return w
}

func (p *parser) accept(tok string) bool {
	p.space()
	if strings.HasPrefix(p.s[p.i:], tok) {
		p.i += len(tok)
		return true
	}
	return false
}

func (p *parser) cmp() string {
	for _, op := range []string{">=", "<=", "==", "!=", ">", "<"} {
		if p.accept(op) {
			return op
		}
	}
	return ""
}

func (p *parser) grouping() (by bool, labels []string, ok bool, err error) {
	p.space()
	save := p.i
	w := p.word()
	if w != "by" && w != "without" {
		p.i = save
		return false, nil, false, nil
	}
	if !p.accept("(") {
		return false, nil, false, p.errorf("expected ( after %s", w)
	}
	for {
		p.space()
		if p.accept(")") {
			return w == "by", labels, true, nil
		}
		l := p.word()
		if l == "" {
			return false, nil, false, p.errorf("expected a label name")
		}
		labels = append(labels, l)
		p.accept(",")
	}
}

func (p *parser) selector(families map[string]*dto.MetricFamily) ([]Sample, error) {
	p.space()
	name := p.word()
	if name == "" {
		return nil, p.errorf("expected a metric name")
	}
	want := map[string]string{}
	if p.accept("{") {
		for {
			p.space()
			if p.accept("}") {
				break
			}
			l := p.word()
			if !p.accept("=") || !p.accept(`"`) {
				return nil, p.errorf("only label=\"value\" matchers are supported")
			}
			j := strings.IndexByte(p.s[p.i:], '"')
			if j < 0 {
				return nil, p.errorf("unterminated string")
			}
			want[l] = p.s[p.i : p.i+j]
			p.i += j + 1
			p.accept(",")
		}
	}
	return selectSamples(families, name, want), nil
}

func (p *parser) vector(families map[string]*dto.MetricFamily) ([]Sample, error) {
	p.space()
	save := p.i
	agg := p.word()
	switch agg {
	case "max", "min", "sum", "count":
	default:
		p.i = save
		return p.selector(families)
	}
	by, labels, grouped, err := p.grouping()
	if err != nil {
		return nil, err
	}
	if !p.accept("(") {
		return nil, p.errorf("expected ( after %s", agg)
	}
	in, err := p.selector(families)
	if err != nil {
		return nil, err
	}
	if !p.accept(")") {
		return nil, p.errorf("expected )")
	}
	if !grouped {
		if by, labels, grouped, err = p.grouping(); err != nil {
			return nil, err
		}
	}
	groups := map[string]*Sample{}
	var order []string
	for _, s := range in {
		key := map[string]string{}
		if grouped {
			keep := map[string]bool{}
			for _, l := range labels {
				keep[l] = true
			}
			for k, v := range s.Labels {
				if keep[k] == by {
					key[k] = v
				}
			}
		}
		id := fmt.Sprint(key)
		g, ok := groups[id]
		if !ok {
			g = &Sample{Labels: key, Value: s.Value}
			if agg == "count" {
				g.Value = 0
			}
			groups[id] = g
			order = append(order, id)
			if agg != "count" {
				continue
			}
		}
		switch agg {
		case "max":
			g.Value = max(g.Value, s.Value)
		case "min":
			g.Value = min(g.Value, s.Value)
		case "sum":
			g.Value += s.Value
		case "count":
			g.Value++
		}
	}
	out := make([]Sample, 0, len(order))
	for _, id := range order {
		out = append(out, *groups[id])
	}
	return out, nil
}
