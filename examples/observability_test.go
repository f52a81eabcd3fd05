package examples

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"go.yaml.in/yaml/v3"
)

// There is no Prometheus or Grafana here, so the files in observability/
// are checked against what they must agree with: docs/metrics.md's Metrics
// table, which another test holds equal to what /metrics serves. Every
// PromQL expression, in the dashboard's panels and in the rule file, is
// read by a small scanner below: each metric it selects must be a row of
// the table (histograms through _bucket, _count or _sum), each label in a
// selector or in by/without/on/ignoring must be one of that row's, and
// each value given to a label the table enumerates (code, kind, result,
// ...) must be one the table names. The scanner is no PromQL parser; it
// knows selectors, aggregations, function calls and ranges, which is all
// these files use, and fails on anything it does not understand.

// obsMetric is a row of docs/metrics.md's Metrics table.
type obsMetric struct {
	name, kind string // kind: counter, gauge or histogram
	labels     map[string]bool
}

// obsCatalogue is docs/metrics.md's Metrics section: its metrics, and for each
// label the values the section names for it.
type obsCatalogue struct {
	metrics map[string]*obsMetric
	values  map[string]map[string]bool
}

// obsEnumerated are the labels whose values come from the code, not from
// the rule files, so docs/metrics.md lists them and a query's values can be
// checked.
var obsEnumerated = map[string]bool{
	"code": true, "kind": true, "result": true, "ttl": true, "backend": true,
	"policy": true, "operation": true, "grpc_code": true,
}

var (
	obsQuoted   = regexp.MustCompile("`([^`]+)`")
	obsLabelRE  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	obsValueRE  = regexp.MustCompile(`^[A-Za-z0-9_./-]+$`)
	obsDuration = regexp.MustCompile(`^(?:[0-9]+(?:ms|s|m|h|d|w|y))+$`)
)

// loadObsCatalogue reads docs/metrics.md's Metrics section. A row's quoted
// words are read left to right, first its labels cell, then its meaning:
// a word that is one of the row's labels makes that label current, any
// other word is a value of the current label (`ttl` (`set` or `none`);
// `kind` is `timeout`, ...). A meaning that names none of the row's labels
// goes on with the labels cell's last one (`operation`: `decide`, ...). A label means the same on every metric that
// has it (code on sluice_decisions_total and on its detailed twin), so
// its values are pooled over the rows; the PromQL the section itself
// shows adds the values it uses (backend="dynamodb").
func loadObsCatalogue(t *testing.T) *obsCatalogue {
	t.Helper()
	raw, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/metrics.md has no Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	c := &obsCatalogue{metrics: map[string]*obsMetric{}, values: map[string]map[string]bool{}}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `sluice_") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			t.Fatalf("docs/metrics.md Metrics row %q: want metric, type, labels and meaning", line)
		}
		m := &obsMetric{
			name:   strings.Trim(strings.TrimSpace(cells[0]), "`"),
			kind:   strings.TrimSpace(cells[1]),
			labels: map[string]bool{},
		}
		if !slices.Contains([]string{"counter", "gauge", "histogram"}, m.kind) {
			t.Fatalf("docs/metrics.md Metrics row %s: type %q", m.name, m.kind)
		}
		for _, q := range obsQuoted.FindAllStringSubmatch(obsOutsideParens(cells[2]), -1) {
			if !obsLabelRE.MatchString(q[1]) {
				t.Fatalf("docs/metrics.md Metrics row %s: label %q", m.name, q[1])
			}
			m.labels[q[1]] = true
		}
		current := ""
		labelsCell := obsQuoted.FindAllStringSubmatch(cells[2], -1)
		meaning := obsQuoted.FindAllStringSubmatch(strings.Join(cells[3:], "|"), -1)
		for i, q := range append(labelsCell, meaning...) {
			w := q[1]
			if i == len(labelsCell) && slices.ContainsFunc(meaning, func(q []string) bool { return m.labels[q[1]] }) {
				current = "" // the meaning names its labels: values follow them
			}
			switch {
			case m.labels[w]:
				current = w
			case current != "" && obsValueRE.MatchString(w) && !strings.HasPrefix(w, "-") && !strings.HasPrefix(w, "sluice_"):
				if c.values[current] == nil {
					c.values[current] = map[string]bool{}
				}
				c.values[current][w] = true
			}
		}
		if c.metrics[m.name] != nil {
			t.Fatalf("docs/metrics.md lists %s twice", m.name)
		}
		c.metrics[m.name] = m
	}
	if len(c.metrics) == 0 {
		t.Fatal("docs/metrics.md's Metrics section has no table of sluice_ metrics")
	}
	// The section's own PromQL: checked like ours, and its values count.
	ck := &obsChecker{cat: c, noValues: true}
	for _, q := range obsQuoted.FindAllStringSubmatch(section, -1) {
		if !strings.Contains(q[1], "{") || !strings.Contains(q[1], "sluice_") {
			continue
		}
		e, errs := ck.check(q[1], false)
		if len(errs) > 0 {
			t.Fatalf("docs/metrics.md Metrics section, %s: %v", q[1], errors.Join(errs...))
		}
		for _, s := range e.selectors {
			for _, m := range s.matchers {
				if m.op == "=" {
					if c.values[m.label] == nil {
						c.values[m.label] = map[string]bool{}
					}
					c.values[m.label][m.value] = true
				}
			}
		}
	}
	return c
}

// obsOutsideParens drops parenthesized text: `rule` (the rule's path,
// e.g. `edge/remote_address`) leaves `rule`.
func obsOutsideParens(s string) string {
	var b strings.Builder
	depth := 0
	for _, r := range s {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// resolve finds the row of a selected series name: a metric of the table,
// or a histogram's _bucket, _count or _sum.
func (c *obsCatalogue) resolve(name string) (*obsMetric, string, error) {
	if m := c.metrics[name]; m != nil {
		if m.kind == "histogram" {
			return nil, "", fmt.Errorf("%s is a histogram: select its _bucket, _count or _sum", name)
		}
		return m, "", nil
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		base, ok := strings.CutSuffix(name, suffix)
		if m := c.metrics[base]; ok && m != nil {
			if m.kind != "histogram" {
				return nil, "", fmt.Errorf("%s: %s is a %s in docs/metrics.md, not a histogram", name, base, m.kind)
			}
			return m, suffix, nil
		}
	}
	return nil, "", fmt.Errorf("metric %s is not in docs/metrics.md's Metrics table", name)
}

// PromQL, as far as the scanner knows it.

type pqKind int

const (
	pqIdent  pqKind = iota
	pqString        // text is the unquoted value
	pqNumber        // numbers and durations: 0.99, 86400, 5m
	pqVar           // a Grafana variable: $domain, ${domain}
	pqRange         // text is what is between [ and ]
	pqPunct
)

type pqToken struct {
	kind pqKind
	text string
}

var (
	pqVarRE      = regexp.MustCompile(`^\$(?:\{[A-Za-z_][A-Za-z0-9_]*(?::[a-z]+)?\}|[A-Za-z_][A-Za-z0-9_]*)`)
	pqVarsIn     = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
	pqRangePart  = `(?:(?:[0-9]+(?:ms|s|m|h|d|w|y))+|\$\{?__(?:rate_interval|interval|range)\}?)`
	pqRangeRE    = regexp.MustCompile(`^` + pqRangePart + `(?::` + pqRangePart + `?)?$`)
	pqOperators2 = []string{"==", "!=", ">=", "<=", "=~", "!~"}
	pqKeywords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true}
	pqJoins      = map[string]bool{"on": true, "ignoring": true, "group_left": true, "group_right": true}
	pqAggOps     = map[string]bool{
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
		"limitk": true, "limit_ratio": true,
	}
	// pqKeepsLabels are the aggregations that pick series rather than
	// merge them: their output has their input's labels.
	pqKeepsLabels = map[string]bool{"topk": true, "bottomk": true, "limitk": true, "limit_ratio": true}
	pqFuncs       = map[string]bool{}
)

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time avg_over_time ceil changes clamp clamp_max
		clamp_min count_over_time day_of_month day_of_week days_in_month delta deriv end exp floor
		histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev
		histogram_stdvar histogram_sum hour idelta increase irate label_join label_replace
		last_over_time ln log10 log2 max_over_time min_over_time minute month predict_linear
		present_over_time quantile_over_time rate resets round scalar sgn sort sort_desc sqrt start
		stddev_over_time stdvar_over_time sum_over_time time timestamp vector year`) {
		pqFuncs[f] = true
	}
}

func pqIdentByte(c byte, first bool) bool {
	return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || (!first && '0' <= c && c <= '9')
}

// pqLex splits expr into tokens; strings must be closed and ranges well
// formed.
func pqLex(expr string) ([]pqToken, error) {
	var toks []pqToken
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			var b strings.Builder
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' && j+1 < len(expr) {
					j++
				}
				b.WriteByte(expr[j])
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string from %q", obsAround(expr, i))
			}
			toks = append(toks, pqToken{pqString, b.String()})
			i = j + 1
		case c == '[':
			j := strings.IndexAny(expr[i+1:], "[]")
			if j < 0 || expr[i+1+j] != ']' {
				return nil, fmt.Errorf("unbalanced [ at %q", obsAround(expr, i))
			}
			inner := strings.TrimSpace(expr[i+1 : i+1+j])
			if !pqRangeRE.MatchString(inner) {
				return nil, fmt.Errorf("range [%s]: want a duration such as [5m], [1h:5m] or [$__rate_interval]", inner)
			}
			toks = append(toks, pqToken{pqRange, inner})
			i += j + 2
		case c == ']':
			return nil, fmt.Errorf("] without [ at %q", obsAround(expr, i))
		case c == '$':
			v := pqVarRE.FindString(expr[i:])
			if v == "" {
				return nil, fmt.Errorf("bad variable at %q", obsAround(expr, i))
			}
			toks = append(toks, pqToken{pqVar, v})
			i += len(v)
		case pqIdentByte(c, true):
			j := i + 1
			for j < len(expr) && pqIdentByte(expr[j], false) {
				j++
			}
			toks = append(toks, pqToken{pqIdent, expr[i:j]})
			i = j
		case '0' <= c && c <= '9' || c == '.':
			j := i + 1
			for j < len(expr) && (pqIdentByte(expr[j], false) && expr[j] != ':' || expr[j] == '.') {
				j++
			}
			toks = append(toks, pqToken{pqNumber, expr[i:j]})
			i = j
		case i+1 < len(expr) && slices.Contains(pqOperators2, expr[i:i+2]):
			toks = append(toks, pqToken{pqPunct, expr[i : i+2]})
			i += 2
		case strings.IndexByte("(){},=<>+-*/%^@", c) >= 0:
			toks = append(toks, pqToken{pqPunct, string(c)})
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at %q", c, obsAround(expr, i))
		}
	}
	return toks, nil
}

func obsAround(s string, i int) string {
	return s[i:min(len(s), i+24)]
}

// pqBalance pairs every ( with its ) and { with its }.
func pqBalance(toks []pqToken) (map[int]int, error) {
	match := map[int]int{}
	var open []int
	for i, tk := range toks {
		if tk.kind != pqPunct {
			continue
		}
		switch tk.text {
		case "(", "{":
			open = append(open, i)
		case ")", "}":
			want := map[string]string{")": "(", "}": "{"}[tk.text]
			if len(open) == 0 || toks[open[len(open)-1]].text != want {
				return nil, fmt.Errorf("unbalanced %s", tk.text)
			}
			match[open[len(open)-1]] = i
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 {
		return nil, fmt.Errorf("unclosed %s", toks[open[len(open)-1]].text)
	}
	return match, nil
}

type pqMatcher struct{ label, op, value string }

type pqSelector struct {
	name     string
	at       int // token index
	matchers []pqMatcher
}

// pqAgg is an aggregation: its clause (by, without or none), the clause's
// labels, and the token indices of the parentheses around its argument.
type pqAgg struct {
	op, clause string
	labels     []string
	from, to   int
}

type pqExpr struct {
	selectors []pqSelector
	aggs      []pqAgg
	joins     []string // labels of on, ignoring, group_left and group_right
	vars      []string // Grafana variables, $__rate_interval included
}

func pqIs(toks []pqToken, i int, kind pqKind, text string) bool {
	return i < len(toks) && toks[i].kind == kind && toks[i].text == text
}

// pqParse finds the selectors, aggregations and joins of expr.
func pqParse(expr string) (*pqExpr, error) {
	toks, err := pqLex(expr)
	if err != nil {
		return nil, err
	}
	match, err := pqBalance(toks)
	if err != nil {
		return nil, err
	}
	e := &pqExpr{}
	// labelList reads "(a, b)" at i and returns the index after it.
	labelList := func(i int, after string) ([]string, int, error) {
		if !pqIs(toks, i, pqPunct, "(") {
			return nil, 0, fmt.Errorf("want a label list after %s", after)
		}
		var labels []string
		for j := i + 1; j < match[i]; j++ {
			switch {
			case toks[j].kind == pqIdent:
				labels = append(labels, toks[j].text)
			case !pqIs(toks, j, pqPunct, ","):
				return nil, 0, fmt.Errorf("label list of %s: unexpected %q", after, toks[j].text)
			}
		}
		return labels, match[i] + 1, nil
	}
	postfix := map[int]int{} // a trailing by/without clause already read: its end
	for i := 0; i < len(toks); i++ {
		if end, ok := postfix[i]; ok {
			i = end - 1
			continue
		}
		tk := toks[i]
		switch tk.kind {
		case pqVar, pqRange, pqString:
			for _, v := range pqVarsIn.FindAllStringSubmatch(tk.text, -1) {
				e.vars = append(e.vars, v[1])
			}
			continue
		case pqPunct:
			if tk.text == "{" {
				return nil, errors.New("label matchers without a metric name")
			}
			continue
		case pqNumber:
			continue
		}
		w := tk.text
		switch {
		case w == "by" || w == "without":
			return nil, fmt.Errorf("%s outside an aggregation", w)
		case pqJoins[w]:
			if pqIs(toks, i+1, pqPunct, "(") {
				labels, end, err := labelList(i+1, w)
				if err != nil {
					return nil, err
				}
				e.joins = append(e.joins, labels...)
				i = end - 1
			} else if w == "on" || w == "ignoring" {
				return nil, fmt.Errorf("%s without a label list", w)
			}
		case pqKeywords[w]:
		case pqAggOps[w]:
			a := pqAgg{op: w}
			j := i + 1
			if pqIs(toks, j, pqIdent, "by") || pqIs(toks, j, pqIdent, "without") {
				a.clause = toks[j].text
				if a.labels, j, err = labelList(j+1, w+" "+a.clause); err != nil {
					return nil, err
				}
			}
			if !pqIs(toks, j, pqPunct, "(") {
				return nil, fmt.Errorf("aggregation %s without its argument in ( )", w)
			}
			a.from, a.to = j, match[j]
			if k := a.to + 1; a.clause == "" && (pqIs(toks, k, pqIdent, "by") || pqIs(toks, k, pqIdent, "without")) {
				a.clause = toks[k].text
				var end int
				if a.labels, end, err = labelList(k+1, w+" "+a.clause); err != nil {
					return nil, err
				}
				postfix[k] = end
			}
			e.aggs = append(e.aggs, a)
			i = j - 1
		case pqIs(toks, i+1, pqPunct, "("):
			if !pqFuncs[w] {
				return nil, fmt.Errorf("unknown function %s", w)
			}
		default:
			s := pqSelector{name: w, at: i}
			if pqIs(toks, i+1, pqPunct, "{") {
				end := match[i+1]
				for k := i + 2; k < end; {
					if k+2 >= end || toks[k].kind != pqIdent || toks[k+1].kind != pqPunct ||
						!slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[k+1].text) || toks[k+2].kind != pqString {
						return nil, fmt.Errorf("%s{...}: want label=\"value\" matchers", w)
					}
					s.matchers = append(s.matchers, pqMatcher{toks[k].text, toks[k+1].text, toks[k+2].text})
					for _, v := range pqVarsIn.FindAllStringSubmatch(toks[k+2].text, -1) {
						e.vars = append(e.vars, v[1])
					}
					k += 3
					if k < end && !pqIs(toks, k, pqPunct, ",") {
						return nil, fmt.Errorf("%s{...}: want , between matchers", w)
					}
					k++
				}
				i = end
			}
			e.selectors = append(e.selectors, s)
		}
	}
	return e, nil
}

// obsChecker checks expressions against the catalogue and the recording
// rules defined so far (their labels, or nil when unknown).
type obsChecker struct {
	cat      *obsCatalogue
	recorded map[string]map[string]bool
	noValues bool // while the catalogue learns values from docs/metrics.md
}

// labelsOf returns the labels a series of name has.
func (ck *obsChecker) labelsOf(name string) (map[string]bool, error) {
	switch {
	case strings.HasPrefix(name, "sluice_"):
		m, suffix, err := ck.cat.resolve(name)
		if err != nil {
			return nil, err
		}
		labels := maps.Clone(m.labels)
		labels["job"], labels["instance"] = true, true
		if suffix == "_bucket" {
			labels["le"] = true
		}
		return labels, nil
	case strings.Contains(name, ":"):
		labels, ok := ck.recorded[name]
		if !ok {
			return nil, fmt.Errorf("recording rule %s is not defined in sluice-alerts.yaml (before its use)", name)
		}
		return labels, nil
	case name == "up":
		return map[string]bool{"job": true, "instance": true}, nil
	}
	return nil, fmt.Errorf("%s is neither a Sluice metric, a recording rule nor up", name)
}

// check scans expr and checks every selector and clause; grafana says
// whether Grafana variables may appear.
func (ck *obsChecker) check(expr string, grafana bool) (*pqExpr, []error) {
	e, err := pqParse(expr)
	if err != nil {
		return nil, []error{err}
	}
	var errs []error
	if len(e.vars) > 0 && !grafana {
		errs = append(errs, fmt.Errorf("Grafana variables %v in a Prometheus expression", e.vars))
	}
	labels := make([]map[string]bool, len(e.selectors))
	for i, s := range e.selectors {
		l, err := ck.labelsOf(s.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		labels[i] = l
		for _, m := range s.matchers {
			if l != nil && !l[m.label] {
				errs = append(errs, fmt.Errorf("%s has no label %q (it has %v)", s.name, m.label, slices.Sorted(maps.Keys(l))))
			} else if obsEnumerated[m.label] && strings.HasPrefix(s.name, "sluice_") && !ck.noValues {
				if err := ck.cat.checkValue(s.name, m); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	for _, a := range e.aggs {
		for i, s := range e.selectors {
			if s.at < a.from || s.at > a.to || labels[i] == nil {
				continue
			}
			for _, l := range a.labels {
				if !labels[i][l] {
					errs = append(errs, fmt.Errorf("%s %s (%s): %s has no label %q", a.op, a.clause, strings.Join(a.labels, ", "), s.name, l))
				}
			}
		}
	}
	for _, l := range e.joins {
		found := l == "job" || l == "instance"
		for i := range e.selectors {
			found = found || labels[i][l]
		}
		if !found {
			errs = append(errs, fmt.Errorf("on/ignoring/group label %q is no label of the series joined", l))
		}
	}
	return e, errs
}

// checkValue checks a matcher's value on an enumerated label; a regular
// expression must be alternatives of literal values (a|b).
func (c *obsCatalogue) checkValue(metric string, m pqMatcher) error {
	vals := []string{m.value}
	if m.op == "=~" || m.op == "!~" {
		vals = strings.Split(m.value, "|")
	}
	known := c.values[m.label]
	for _, v := range vals {
		if !obsValueRE.MatchString(v) {
			return fmt.Errorf("%s{%s%s%q}: only literal values (a|b) can be checked", metric, m.label, m.op, m.value)
		}
		if !known[v] {
			return fmt.Errorf("%s{%s%s%q}: docs/metrics.md's Metrics table names no value %q for %s (it names %v)",
				metric, m.label, m.op, m.value, v, m.label, slices.Sorted(maps.Keys(known)))
		}
	}
	return nil
}

// outputLabels are the labels of the series expr returns, as far as the
// scanner can tell: a selector's own labels, or those of the outermost
// aggregation around it that merges series. ok is false when unknown.
func (ck *obsChecker) outputLabels(e *pqExpr) (out map[string]bool, ok bool) {
	out = map[string]bool{}
	for _, s := range e.selectors {
		var outer *pqAgg
		for i, a := range e.aggs {
			if s.at > a.from && s.at < a.to && !pqKeepsLabels[a.op] && (outer == nil || a.from < outer.from) {
				outer = &e.aggs[i]
			}
		}
		own, err := ck.labelsOf(s.name)
		switch {
		case outer != nil && outer.clause == "by":
			for _, l := range outer.labels {
				out[l] = true
			}
		case outer != nil && outer.clause == "":
		case err != nil || own == nil:
			return nil, false
		default:
			for l := range own {
				if outer == nil || !slices.Contains(outer.labels, l) {
					out[l] = true
				}
			}
		}
	}
	delete(out, "le")
	return out, true
}

// The dashboard.

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Collapsed  bool               `json:"collapsed"`
	Datasource *grafanaDatasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []json.RawMessage `json:"targets"`
	Panels  []grafanaPanel    `json:"panels"`
}

// grafanaTarget is a Prometheus query of a panel, decoded strictly: a
// misspelt field (exp for expr) fails.
type grafanaTarget struct {
	RefID          string             `json:"refId"`
	Expr           string             `json:"expr"`
	LegendFormat   string             `json:"legendFormat"`
	Datasource     *grafanaDatasource `json:"datasource"`
	Range          bool               `json:"range"`
	Instant        bool               `json:"instant"`
	EditorMode     string             `json:"editorMode"`
	Format         string             `json:"format"`
	Interval       string             `json:"interval"`
	IntervalFactor int                `json:"intervalFactor"`
	Hide           bool               `json:"hide"`
	Exemplar       bool               `json:"exemplar"`
}

type grafanaDashboard struct {
	ID            json.RawMessage `json:"id"`
	UID           string          `json:"uid"`
	Title         string          `json:"title"`
	SchemaVersion int             `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Type       string             `json:"type"`
			Name       string             `json:"name"`
			Query      json.RawMessage    `json:"query"`
			Definition string             `json:"definition"`
			Datasource *grafanaDatasource `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

const obsDashboardFile = "observability/sluice-dashboard.json"

func TestObservabilityDashboard(t *testing.T) {
	cat := loadObsCatalogue(t)
	raw, err := os.ReadFile(obsDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", obsDashboardFile, err)
	}
	if string(d.ID) != "null" || d.UID == "" || len(d.UID) > 40 || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("dashboard id %s uid %q title %q schemaVersion %d: want id null (Grafana assigns one), a uid of at most 40 characters, a title and schemaVersion 36 or later",
			d.ID, d.UID, d.Title, d.SchemaVersion)
	}

	// Variables: the data source, and query variables whose label_values
	// name a real metric and label.
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-z_:]+)\s*,\s*([a-zA-Z_]+)\s*\)$`)
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		var query string
		if err := json.Unmarshal(v.Query, &query); err != nil {
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query %s", v.Name, v.Query)
			}
			query = q.Query
		}
		switch v.Type {
		case "datasource":
			if v.Name != "datasource" || query != "prometheus" {
				t.Errorf("data source variable %q for %q: want datasource, for prometheus", v.Name, query)
			}
		case "query":
			m := labelValues.FindStringSubmatch(query)
			if m == nil || v.Definition != query || v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("variable %s: query %q, definition %q: want label_values(metric, label) in both, from ${datasource}", v.Name, query, v.Definition)
				continue
			}
			labels, err := (&obsChecker{cat: cat}).labelsOf(m[1])
			if err != nil {
				t.Errorf("variable %s: %v", v.Name, err)
			} else if !labels[m[2]] {
				t.Errorf("variable %s: %s has no label %q", v.Name, m[1], m[2])
			}
		}
	}
	if !vars["datasource"] || !vars["domain"] {
		t.Errorf("want the variables datasource and domain, have %v", slices.Sorted(maps.Keys(vars)))
	}

	// Panels, those in collapsed rows included.
	ck := &obsChecker{cat: cat}
	ids, titles := map[int]bool{}, map[string]bool{}
	used := map[string]bool{}
	var walk func(where string, panels []grafanaPanel, inRow bool)
	walk = func(where string, panels []grafanaPanel, inRow bool) {
		for i, p := range panels {
			name := fmt.Sprintf("panel %q (id %d)", p.Title, p.ID)
			if p.ID <= 0 || ids[p.ID] || p.Title == "" || titles[p.Title] || p.Type == "" {
				t.Errorf("%s %s: want a type, and an id and a title no other panel has", where, name)
			}
			ids[p.ID], titles[p.Title] = true, true
			if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v: want one inside the 24 columns", name, p.GridPos)
			}
			for _, q := range panels[:i] {
				if a, b := p.GridPos, q.GridPos; a != nil && b != nil &&
					a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
					t.Errorf("%s overlaps panel %q", name, q.Title)
				}
			}
			if p.Type == "row" {
				if inRow || len(p.Targets) > 0 || (!p.Collapsed && len(p.Panels) > 0) || p.GridPos == nil || p.GridPos.W != 24 {
					t.Errorf("%s: a row spans the width, has no queries, is not nested, and holds panels only when collapsed", name)
				}
				walk(name, p.Panels, true)
				continue
			}
			if len(p.Panels) > 0 {
				t.Errorf("%s: only rows hold panels", name)
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: data source %+v, want prometheus ${datasource}", name, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no queries", name)
			}
			refs := map[string]bool{}
			for _, rawTarget := range p.Targets {
				var tg grafanaTarget
				dec := json.NewDecoder(bytes.NewReader(rawTarget))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&tg); err != nil {
					t.Errorf("%s: target %s: %v", name, rawTarget, err)
					continue
				}
				where := fmt.Sprintf("%s: %s: target %s", obsDashboardFile, name, tg.RefID)
				if tg.RefID == "" || refs[tg.RefID] || tg.Expr == "" || tg.LegendFormat == "" {
					t.Errorf("%s: want a refId of its own, an expr and a legendFormat", where)
				}
				refs[tg.RefID] = true
				if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s: data source %+v, want ${datasource}", where, tg.Datasource)
				}
				e, errs := ck.check(tg.Expr, true)
				for _, err := range errs {
					t.Errorf("%s: %v", where, err)
				}
				if e == nil {
					continue
				}
				for _, v := range e.vars {
					if !vars[v] {
						t.Errorf("%s: variable $%s is not defined", where, v)
					}
				}
				for _, s := range e.selectors {
					if m, _, err := cat.resolve(s.name); err == nil {
						used[m.name] = true
					}
				}
			}
		}
	}
	walk(obsDashboardFile, d.Panels, false)

	// A metric docs/metrics.md lists and the dashboard leaves out is a metric
	// nobody looks at: add a panel for it.
	for name := range cat.metrics {
		if !used[name] {
			t.Errorf("%s: no panel shows %s", obsDashboardFile, name)
		}
	}
}

// The rule file.

type promRuleFile struct {
	Groups []struct {
		Name     string     `yaml:"name"`
		Interval string     `yaml:"interval"`
		Rules    []promRule `yaml:"rules"`
	} `yaml:"groups"`
}

type promRule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

const obsAlertsFile = "observability/sluice-alerts.yaml"

func loadPromRules(t *testing.T) promRuleFile {
	t.Helper()
	raw, err := os.ReadFile(obsAlertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f promRuleFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", obsAlertsFile, err)
	}
	return f
}

// promTemplateFuncs stand in for the functions Prometheus gives alert
// templates, enough to parse and run them.
var promTemplateFuncs = template.FuncMap{}

func init() {
	for _, f := range strings.Fields(`humanize humanize1024 humanizeDuration humanizePercentage humanizeTimestamp
		title toUpper toLower reReplaceAll match safeHtml stripPort stripDomain pathPrefix externalURL
		parseDuration first label value strvalue sortByLabel args tableLink graphLink query`) {
		promTemplateFuncs[f] = func(args ...any) (string, error) { return fmt.Sprint(args...), nil }
	}
}

// runPromTemplate renders an annotation as Prometheus would; with labels
// known, a $labels.x the alert's series do not have fails.
func runPromTemplate(text string, labels map[string]bool) error {
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
	tmpl, err := template.New("").Funcs(promTemplateFuncs).Parse(defs + text)
	if err != nil {
		return err
	}
	data := struct {
		Labels, ExternalLabels map[string]string
		ExternalURL            string
		Value                  float64
	}{Labels: map[string]string{}, ExternalLabels: map[string]string{}, Value: 1}
	if labels != nil {
		tmpl.Option("missingkey=error")
		for l := range labels {
			data.Labels[l] = "x"
		}
	}
	return tmpl.Execute(&bytes.Buffer{}, data)
}

func TestObservabilityAlerts(t *testing.T) {
	f := loadPromRules(t)
	ck := &obsChecker{cat: loadObsCatalogue(t), recorded: map[string]map[string]bool{}}
	recordName := regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*$`)
	alertName := regexp.MustCompile(`^Sluice[A-Z][A-Za-z0-9]*$`)
	groups, alerts := map[string]bool{}, map[string]bool{}
	if len(f.Groups) == 0 {
		t.Fatalf("%s: no groups", obsAlertsFile)
	}
	for _, g := range f.Groups {
		if g.Name == "" || groups[g.Name] || len(g.Rules) == 0 || (g.Interval != "" && !obsDuration.MatchString(g.Interval)) {
			t.Errorf("%s: group %q: want a name of its own, rules, and no or a valid interval", obsAlertsFile, g.Name)
		}
		groups[g.Name] = true
		for i, r := range g.Rules {
			where := fmt.Sprintf("%s: group %s: rule %d (%s%s)", obsAlertsFile, g.Name, i+1, r.Alert, r.Record)
			if (r.Alert == "") == (r.Record == "") || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: want one of alert and record, and an expr", where)
				continue
			}
			e, errs := ck.check(r.Expr, false)
			for _, err := range errs {
				t.Errorf("%s: %v", where, err)
			}
			var out map[string]bool
			if e != nil {
				if o, ok := ck.outputLabels(e); ok {
					out = o
					for l := range r.Labels {
						out[l] = true
					}
				}
			}
			if r.Record != "" {
				if !recordName.MatchString(r.Record) || ck.recorded[r.Record] != nil || r.For != "" || len(r.Annotations) > 0 {
					t.Errorf("%s: want a level:metric:operations name used once, and no for or annotations", where)
				}
				if out == nil {
					out = map[string]bool{} // defined, labels unknown
				}
				ck.recorded[r.Record] = out
				continue
			}
			if !alertName.MatchString(r.Alert) || alerts[r.Alert] {
				t.Errorf("%s: want a name SluiceSomething no other alert has", where)
			}
			alerts[r.Alert] = true
			if !obsDuration.MatchString(r.For) || (r.KeepFiringFor != "" && !obsDuration.MatchString(r.KeepFiringFor)) {
				t.Errorf("%s: for %q: want a duration such as 5m", where, r.For)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", where, s)
			}
			for _, k := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[k]) == "" {
					t.Errorf("%s: no %s annotation", where, k)
				}
			}
			for k, text := range r.Annotations {
				if err := runPromTemplate(text, out); err != nil {
					t.Errorf("%s: annotation %s: %v", where, k, err)
				}
			}
		}
	}
}

// TestObservabilityReadme keeps the README beside the files in step with
// them: each alert explained, each file it names there.
func TestObservabilityReadme(t *testing.T) {
	raw, err := os.ReadFile("observability/README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	defined := map[string]bool{}
	for _, g := range loadPromRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				defined[r.Alert] = true
				if !strings.Contains(readme, "`"+r.Alert+"`") {
					t.Errorf("observability/README.md does not explain %s", r.Alert)
				}
			}
		}
	}
	for _, m := range regexp.MustCompile("`(Sluice[A-Z][A-Za-z0-9]*)`").FindAllStringSubmatch(readme, -1) {
		if !defined[m[1]] {
			t.Errorf("observability/README.md explains %s, which sluice-alerts.yaml does not define", m[1])
		}
	}
	for _, m := range regexp.MustCompile(`\]\(([^)#]+)(?:#[^)]*)?\)`).FindAllStringSubmatch(readme, -1) {
		if strings.Contains(m[1], "://") {
			continue
		}
		if _, err := os.Stat("observability/" + m[1]); err != nil {
			t.Errorf("observability/README.md links %s: %v", m[1], err)
		}
	}
}

// TestObservabilityCheckerFails shows the checks above catch what they
// are for: each expression here is wrong in one way.
func TestObservabilityCheckerFails(t *testing.T) {
	ck := &obsChecker{cat: loadObsCatalogue(t), recorded: map[string]map[string]bool{"sluice:known:rate5m": {"job": true}}}
	for _, c := range []struct{ expr, want string }{
		{`rate(sluice_decisons_total[5m])`, "not in docs/metrics.md's Metrics table"},
		{`sum by (domian) (rate(sluice_decisions_total[5m]))`, `has no label "domian"`},
		{`sum(rate(sluice_decisions_total[5m])) by (entity)`, `has no label "entity"`},
		{`sluice_decisions_total{rule="a", cod="ok"}`, `has no label "cod"`},
		{`sluice_decisions_total{code="denied"}`, `names no value "denied"`},
		{`sluice_backend_call_errors_total{kind=~"timeout|Throttl.*"}`, "only literal values"},
		{`sluice_bucket_writes_total{ttl="never"}`, `names no value "never"`},
		{`sluice_failure_policy_activations_total{policy="maybe"}`, `names no value "maybe"`},
		{`rate(sluice_request_duration_seconds[5m])`, "is a histogram"},
		{`rate(sluice_decisions_total_bucket[5m])`, "not a histogram"},
		{`sum by (le) (rate(sluice_request_duration_seconds_count[5m]))`, `has no label "le"`},
		{`sluice_tls_reloads_total / on (domain) sluice_config_reloads_total`, `label "domain"`},
		{`rate(sluice_decisions_total[5x])`, "range [5x]"},
		{`sum(rate(sluice_decisions_total[5m])`, "unclosed ("},
		{`sluice_decisions_total{code="ok}`, "unterminated string"},
		{`{code="ok"}`, "without a metric name"},
		{`rat(sluice_decisions_total[5m])`, "unknown function rat"},
		{`sluice:unknown:rate5m > 1`, "is not defined"},
		{`sluice_decisions_total{domain=~"$domain"}`, "Grafana variables"},
		{`process_cpu_seconds_total`, "neither a Sluice metric"},
	} {
		_, errs := ck.check(c.expr, false)
		if err := errors.Join(errs...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.expr, err, c.want)
		}
	}
	for _, ok := range []string{
		`sum(rate(sluice_decisions_total{code=~"ok|near_limit"}[5m])) by (domain)`,
		`histogram_quantile(0.99, sum by (le) (rate(sluice_bucket_ttl_seconds_bucket[1h:5m])))`,
		`sluice:known:rate5m{job="sluice"} > 1 and on (job) up == 1`,
	} {
		if _, errs := ck.check(ok, false); len(errs) > 0 {
			t.Errorf("%s: %v", ok, errors.Join(errs...))
		}
	}
}
