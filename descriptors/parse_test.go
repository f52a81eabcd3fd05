package descriptors

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
)

// wantErr is one expected problem: in file, at line, with msg in its text.
type wantErr struct {
	file string
	line int
	msg  string
}

// configErrors flattens the error returned by Load into *Error values.
func configErrors(t *testing.T, err error) []*Error {
	t.Helper()
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %q is not an *Error", err)
		}
		out = append(out, e)
	}
	walk(err)
	return out
}

func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  []wantErr
	}{
		{"unknown top-level key", map[string]string{"a.yaml": "domain: d\ndomian: x\n"},
			[]wantErr{{"a.yaml", 2, `unknown key "domian" in the top level`}}},
		{"unknown descriptor key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    valeu: v\n"},
			[]wantErr{{"a.yaml", 4, `unknown key "valeu" in descriptor`}}},
		{"unknown rate_limit key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_uint: 5\n"},
			[]wantErr{{"a.yaml", 6, `unknown key "requests_per_uint" in rate_limit`}}},
		{"unknown limits key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1/s\n        brust: 3\n"},
			[]wantErr{{"a.yaml", 7, `unknown key "brust" in limits entry`}}},
		{"unknown replaces key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - nmae: x\n"},
			[]wantErr{{"a.yaml", 7, `unknown key "nmae" in rate_limit.replaces entry`}, {"a.yaml", 7, "entry has no name"}}},
		{"key set twice in a mapping", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    key: j\n"},
			[]wantErr{{"a.yaml", 4, `key "key" is already set at line 3`}}},
		{"key of the wrong type", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: [a, b]\n"},
			[]wantErr{{"a.yaml", 3, "key: want a string, got a list"}}},
		{"boolean of the wrong type", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n"},
			[]wantErr{{"a.yaml", 4, `shadow_mode: want true or false, got a string ("maybe")`}}},
		{"global not a boolean", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    global: everywhere\n"},
			[]wantErr{{"a.yaml", 4, `global: want true or false, got a string ("everywhere")`}}},
		{"quota_mode not a boolean", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    quota_mode: soft\n"},
			[]wantErr{{"a.yaml", 4, `quota_mode: want true or false, got a string ("soft")`}}},
		{"metadata not a mapping", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    metadata: [a, b]\n"},
			[]wantErr{{"a.yaml", 4, "metadata: want a mapping, got a list"}}},
		{"metadata key set twice", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      a: {b: 1, b: 2}\n"},
			[]wantErr{{"a.yaml", 5, `metadata: key "b" is set twice`}}},
		{"metadata number a Struct cannot hold", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    metadata: {n: .inf}\n"},
			[]wantErr{{"a.yaml", 4, `metadata: ".inf" is not a number`}}},
		{"metadata key not a string", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    metadata: {[a]: 1}\n"},
			[]wantErr{{"a.yaml", 4, "metadata: a key must be a string, got a list"}}},
		{"top-level name not a string", map[string]string{"a.yaml": "domain: d\nname: [x]\n"},
			[]wantErr{{"a.yaml", 2, "name: want a string, got a list"}}},
		{"rate_limit not a mapping", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: 5/s\n"},
			[]wantErr{{"a.yaml", 4, `rate_limit: want a mapping, got a string ("5/s")`}}},
		{"limits not a list", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      rpm: 5/s\n"},
			[]wantErr{{"a.yaml", 5, "limits: want a list, got a mapping"}}},
		{"template not a string", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    entity: [k]\n"},
			[]wantErr{{"a.yaml", 4, "entity: want a string, got a list"}}},
		{"rate not a string", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: {n: 1}\n"},
			[]wantErr{{"a.yaml", 6, "limits.rate: want a string, got a mapping"}}},
		{"domain not a string", map[string]string{"a.yaml": "domain: {a: b}\n"},
			[]wantErr{{"a.yaml", 1, "domain: want a string, got a mapping"}}},
		{"descriptors not a list", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  key: k\n"},
			[]wantErr{{"a.yaml", 3, "descriptors: want a list, got a mapping"}}},
		{"descriptor not a mapping", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - k\n"},
			[]wantErr{{"a.yaml", 3, "descriptor: want a mapping"}}},
		{"file not a mapping", map[string]string{"a.yaml": "- domain: d\n"},
			[]wantErr{{"a.yaml", 1, "file: want a mapping, got a list"}}},
		{"requests_per_unit not a number", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: ten\n"},
			[]wantErr{{"a.yaml", 6, "requests_per_unit: want a whole number"}}},
		{"requests_per_unit negative", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n"},
			[]wantErr{{"a.yaml", 6, "requests_per_unit: want a whole number"}}},
		{"requests_per_unit above uint32", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n"},
			[]wantErr{{"a.yaml", 6, "requests_per_unit: want a whole number"}}},
		{"empty domain", map[string]string{"a.yaml": "domain: \"\"\ndescriptors: []\n"},
			[]wantErr{{"a.yaml", 1, "empty domain"}}},
		{"missing domain", map[string]string{"a.yaml": "# no domain\ndescriptors: []\n"},
			[]wantErr{{"a.yaml", 2, "file has no domain"}}},
		{"empty file", map[string]string{"a.yaml": "# nothing\n"},
			[]wantErr{{"a.yaml", 1, "empty file"}}},
		{"empty key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: \"\"\n    value: v\n"},
			[]wantErr{{"a.yaml", 3, "empty key"}}},
		{"missing key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - value: v\n"},
			[]wantErr{{"a.yaml", 3, "descriptor has no key"}}},
		{"duplicate domain across files", map[string]string{"a.yaml": "domain: d\n", "b.yml": "# same\ndomain: d\n"},
			[]wantErr{{"b.yml", 2, `duplicate domain "d" (already defined in a.yaml)`}}},
		{"duplicate key and value", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: w\n  - key: k\n    value: v\n"},
			[]wantErr{{"a.yaml", 7, `duplicate descriptor: key "k" with value "v" is already at line 3`}}},
		{"duplicate wildcard", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    value: v*\n  - key: k\n    value: v*\n"},
			[]wantErr{{"a.yaml", 5, `key "k" with value "v*" is already at line 3`}}},
		{"duplicate bare key, nested", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: p\n    descriptors:\n      - key: k\n      - key: k\n        value: \"\"\n"},
			[]wantErr{{"a.yaml", 6, `duplicate descriptor: key "k" without a value is already at line 5`}}},
		// Two nodes that spell one path would share buckets.
		{"one path from '=' in a key and a value", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a=b\n    value: c\n  - key: a\n    value: b=c\n"},
			[]wantErr{{"a.yaml", 5, `descriptor path "d/a=b=c" is already the path of the descriptor at line 3`}}},
		{"one path from '/' in a key, nested", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a/b\n    value: c\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n"},
			[]wantErr{{"a.yaml", 7, `descriptor path "d/a/b=c" is already the path of the descriptor at line 3`}}},
		{"bad rate", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 100/fortnight\n"},
			[]wantErr{{"a.yaml", 6, `limit "a": rate "100/fortnight"`}}},
		{"rate without unit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - {name: a, rate: \"100\"}\n"},
			[]wantErr{{"a.yaml", 5, `limit "a": rate "100": want N/unit`}}},
		{"missing rate", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n"},
			[]wantErr{{"a.yaml", 5, `limit "a": missing rate`}}},
		{"limit without name", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - rate: 1/s\n"},
			[]wantErr{{"a.yaml", 5, "limits: entry has no name"}}},
		{"bad unit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n"},
			[]wantErr{{"a.yaml", 5, `invalid unit "fortnight"`}}},
		{"abbreviated unit in rate_limit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: s\n      requests_per_unit: 1\n"},
			[]wantErr{{"a.yaml", 5, `invalid unit "s"`}}},
		{"missing unit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n"},
			[]wantErr{{"a.yaml", 4, "rate_limit: missing unit"}}},
		{"bad burst", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1/s\n        burst: -1\n"},
			[]wantErr{{"a.yaml", 7, `limit "a": burst: want a whole number of tokens`}}},
		{"burst not a number", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1/s\n        burst: 1.5\n"},
			[]wantErr{{"a.yaml", 7, "burst: want a whole number of tokens"}}},
		{"bad debt", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1/s\n        debt: -5\n"},
			[]wantErr{{"a.yaml", 7, `limit "a": debt: want a whole number of tokens`}}},
		{"budget in a zone that does not exist", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1000\n        period: month\n        zone: Europe/Atlantis\n"},
			[]wantErr{{"a.yaml", 8, `limit "a": zone: time zone "Europe/Atlantis" does not exist`}}},
		{"budget for a period that is no calendar's", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1000\n        period: fortnight\n"},
			[]wantErr{{"a.yaml", 7, `limit "a": period: unknown period "fortnight"`}}},
		{"budget for an hour", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - {name: a, rate: 1000, period: hour}\n"},
			[]wantErr{{"a.yaml", 5, `limit "a": period: unknown period "hour"`}}},
		{"budget whose rate is for another unit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1000/day\n        period: month\n"},
			[]wantErr{{"a.yaml", 6, `a budget for a month is N or N/month`}}},
		{"zone on a rate", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1000/min\n        zone: UTC\n"},
			[]wantErr{{"a.yaml", 6, `a zone is for a budget`}}},
		{"budget with a burst", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - {name: a, rate: 1000, period: month, burst: 2000}\n"},
			[]wantErr{{"a.yaml", 5, `a budget for a month has no burst of its own`}}},
		{"budget with more debt than a period repays", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - {name: a, rate: 1000, period: day, debt: 1001}\n"},
			[]wantErr{{"a.yaml", 5, `a budget's debt may be at most the budget`}}},
		{"bad charges", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    charges: sometimes\n    limits:\n      - {name: a, rate: 1/s}\n"},
			[]wantErr{{"a.yaml", 4, `charges: want own_hits, always or never, got "sometimes"`}}},
		{"bad cost", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - name: a\n        rate: 1/s\n        cost: tokens\n"},
			[]wantErr{{"a.yaml", 7, `cost: want hits or request, got "tokens"`}}},
		{"unlimited with a unit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n"},
			[]wantErr{{"a.yaml", 6, "an unlimited rate limit must not have a unit"}}},
		{"unlimited with limits", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n    limits:\n      - {name: a, rate: 1/s}\n"},
			[]wantErr{{"a.yaml", 6, "unlimited rule (rate_limit.unlimited) must not have limits"}}},
		{"replaces naming its own rule", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: second\n      replaces:\n        - name: me\n"},
			[]wantErr{{"a.yaml", 8, `"me" is the name of this rule itself`}}},
		{"replaces naming its own limit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces: [{name: rpm}]\n    limits:\n      - {name: rpm, rate: 1/s}\n"},
			[]wantErr{{"a.yaml", 8, `"rpm" is the name of a limit of this rule itself`}}},
		{"empty replaces name", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - name: \"\"\n"},
			[]wantErr{{"a.yaml", 7, "rate_limit.replaces: empty name"}}},
		{"duplicate limit names", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, name: rpm}\n    limits:\n      - {name: tpm, rate: 1/s}\n      - {name: rpm, rate: 1/s}\n"},
			[]wantErr{{"a.yaml", 7, `limits: name "rpm" is used twice`}}},
		{"limit named like the unnamed rate_limit", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n    limits:\n      - {name: default, rate: 1/s}\n"},
			[]wantErr{{"a.yaml", 6, `limits: name "default" is used twice`}}},
		{"template key not on the path", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        entity: \"{c}\"\n"},
			[]wantErr{{"a.yaml", 6, `entity: template "{c}": key "c" is not on the path to this node (a > b)`}}},
		{"template key of a sibling", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n  - key: b\n    resource: \"r:{a}\"\n"},
			[]wantErr{{"a.yaml", 5, `resource: template "r:{a}": key "a" is not on the path`}}},
		{"template key at two levels", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: a\n        parent: \"{a}\"\n"},
			[]wantErr{{"a.yaml", 6, `parent: template "{a}": key "a" is at more than one level of the path (a > a): ambiguous`}}},
		{"template open brace", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    entity: \"x{a\"\n"},
			[]wantErr{{"a.yaml", 4, `'{' without '}'`}}},
		{"template nested brace", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    entity: \"{x{a}}\"\n"},
			[]wantErr{{"a.yaml", 4, `'{' without '}'`}}},
		{"template close brace", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    entity: \"a}\"\n"},
			[]wantErr{{"a.yaml", 4, `'}' without '{'`}}},
		{"template empty placeholder", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    entity: \"{}\"\n"},
			[]wantErr{{"a.yaml", 4, "empty placeholder"}}},
		{"empty template", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    parent: \"\"\n"},
			[]wantErr{{"a.yaml", 4, "parent: empty template"}}},
		{"share_threshold on an exact value", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    value: v\n    share_threshold: true\n"},
			[]wantErr{{"a.yaml", 5, "share_threshold is only meaningful on a wildcard value"}}},
		{"share_threshold on a bare key", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n"},
			[]wantErr{{"a.yaml", 4, "share_threshold is only meaningful on a wildcard value"}}},
		{"YAML syntax error", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: [a,\n"},
			[]wantErr{{"a.yaml", 3, "invalid YAML: did not find expected node content"}}},
		{"alias to an ancestor", map[string]string{"a.yaml": "domain: d\ndescriptors: &top\n  - key: a\n    descriptors: *top\n"},
			[]wantErr{{"a.yaml", 3, "nested more than 64 levels deep"}}},
		{"every problem of every file", map[string]string{
			"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    bogus: 1\n  - key: \"\"\n",
			"b.yaml": "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: parsec}\n",
		}, []wantErr{{"a.yaml", 4, `unknown key "bogus"`}, {"a.yaml", 5, "empty key"}, {"b.yaml", 4, `invalid unit "parsec"`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadFiles(t, tt.files)
			if err == nil {
				t.Fatalf("Load succeeded with %d rules, want errors", len(c.Rules()))
			}
			got := configErrors(t, err)
			for _, w := range tt.want {
				found := slices.ContainsFunc(got, func(e *Error) bool {
					return e.File == w.file && e.Line == w.line && strings.Contains(e.Msg, w.msg)
				})
				if !found {
					t.Errorf("missing error %s:%d: ...%s...\ngot:\n%v", w.file, w.line, w.msg, err)
				}
				// The text operators read names the file and the line.
				prefix := w.file + ":" + strconv.Itoa(w.line) + ": "
				if !strings.Contains(err.Error(), prefix) {
					t.Errorf("error text lacks %q:\n%v", prefix, err)
				}
			}
			if len(got) != len(tt.want) {
				t.Errorf("%d errors, want %d:\n%v", len(got), len(tt.want), err)
			}
		})
	}
}

// global marks a node's limits as one limit across regions; it is not
// inherited by the node's children, which have limits of their own.
func TestGlobalKey(t *testing.T) {
	c := mustLoad(t, map[string]string{"a.yaml": `domain: d
descriptors:
  - key: tenant
    global: true
    limits: [{name: rpm, rate: 1000/min}]
    descriptors:
      - key: path
        limits: [{name: rpm, rate: 10/s}]
  - key: ip
    limits: [{name: rps, rate: 5/s}]
`})
	for _, x := range []struct {
		d    *rlv3.RateLimitDescriptor
		want bool
	}{
		{desc("tenant", "t1"), true},
		{desc("tenant", "t1", "path", "/a"), false},
		{desc("ip", "192.0.2.1"), false},
	} {
		m, ok := c.Match("d", x.d)
		if !ok || m.Rule.Global != x.want {
			t.Errorf("%v: matched %v, global %v; want global %v", x.d.GetEntries(), ok, m.Rule.Global, x.want)
		}
	}
}

// charges and limits[].debt load with what they say; a node without
// charges, one in envoyproxy/ratelimit's format among them, counts a
// descriptor's own hits as a charge, and a limit without debt may go one
// burst below zero.
func TestChargesAndDebtKeys(t *testing.T) {
	c := mustLoad(t, map[string]string{"a.yaml": `domain: d
descriptors:
  - key: tenant
    charges: never
    limits: [{name: tpm, rate: 1000/min, debt: 0}]
  - key: model
    charges: always
    limits: [{name: tpm, rate: 1000/min, burst: 2000, debt: 5000}]
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
`})
	for _, x := range []struct {
		d       *rlv3.RateLimitDescriptor
		charges Charges
		floor   int64
	}{
		{desc("tenant", "t1"), ChargesNever, 0},
		{desc("model", "m"), ChargesAlways, -5000 * bucket.Milli},
		{desc("ip", "192.0.2.1"), ChargesOwnHits, -10 * bucket.Milli},
	} {
		m, ok := c.Match("d", x.d)
		if !ok || m.Rule.Charges != x.charges || bucket.Floor(m.Rule.Limits[0]) != x.floor {
			t.Errorf("%v: matched %v, charges %v, floor %d; want %v, %d", x.d.GetEntries(), ok, m.Rule.Charges,
				bucket.Floor(m.Rule.Limits[0]), x.charges, x.floor)
		}
	}
}

// A budget loads beside rates in one descriptor: 20 rpm, 60,000 tpm and
// 10 million tokens a calendar month in Berlin, written either way; the
// limits of one file share their zone.
func TestBudgetKeys(t *testing.T) {
	c := mustLoad(t, map[string]string{"a.yaml": `domain: d
descriptors:
  - key: tenant
    limits:
      - {name: rpm, rate: 20/min, cost: request}
      - {name: tpm, rate: 60000/min}
      - {name: month, rate: 10000000, period: month, zone: Europe/Berlin}
  - key: team
    limits:
      - {name: day, rate: 500000/day, zone: Europe/Berlin, debt: 0}
      - {name: week, rate: 1000000, period: weekly}
`})
	m, ok := c.Match("d", desc("tenant", "t1"))
	if !ok || len(m.Rule.Limits) != 3 {
		t.Fatalf("tenant: %v %+v", ok, m.Rule)
	}
	mo := m.Rule.Limits[2]
	if mo.Calendar != period.Month || mo.ZoneName() != "Europe/Berlin" || mo.Amount != 10_000_000*bucket.Milli || mo.Burst != mo.Amount || m.Rule.Limits[1].IsBudget() {
		t.Fatalf("month: %+v", mo)
	}
	n, _ := c.Match("d", desc("team", "x"))
	day, week := n.Rule.Limits[0], n.Rule.Limits[1]
	if day.Calendar != period.Day || day.Zone != mo.Zone || day.Debt != bucket.NoDebt || week.Calendar != period.Week || week.ZoneName() != "UTC" {
		t.Fatalf("team: %+v %+v", day, week)
	}
}

// The keys envoyproxy/ratelimit added in 2025-2026 load with what they
// say: the top-level name, quota_mode, value_to_metric and a free-form
// metadata mapping (nested mappings and lists, numbers as a Struct holds
// them, aliases followed).
func TestNewerEnvoyproxyKeys(t *testing.T) {
	c := mustLoad(t, map[string]string{"a.yaml": `name: first-listener
domain: d
descriptors:
  - key: service
    value: s1
    quota_mode: true
    value_to_metric: false
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: &md
      service_with_quota: {name: s1, tier: 2, tags: [a, b], on: true, none: null}
  - key: user
    value_to_metric: true
    metadata: *md
`})
	if got := c.Name("d"); got != "first-listener" {
		t.Errorf("Name = %q", got)
	}
	s1, ok := c.Match("d", desc("service", "s1"))
	if !ok || !s1.Rule.QuotaMode || s1.Rule.ValueToMetric {
		t.Fatalf("service=s1: %+v", s1.Rule)
	}
	want := map[string]any{"service_with_quota": map[string]any{
		"name": "s1", "tier": float64(2), "tags": []any{"a", "b"}, "on": true, "none": nil}}
	if !reflect.DeepEqual(s1.Rule.Metadata, want) {
		t.Errorf("metadata %#v, want %#v", s1.Rule.Metadata, want)
	}
	u, ok := c.Match("d", desc("user", "alice"))
	if !ok || u.Rule.QuotaMode || !u.Rule.ValueToMetric || !reflect.DeepEqual(u.Rule.Metadata, want) {
		t.Errorf("user=alice: %+v", u.Rule)
	}
	if got := u.Rule.StatsKey(desc("user", "alice").GetEntries()); got != "d.user_alice" {
		t.Errorf("stats key %q, want d.user_alice", got)
	}
}

// Things envoyproxy/ratelimit accepts must load.
func TestAccepted(t *testing.T) {
	tests := []struct {
		name, yaml string
	}{
		{"no descriptors", "domain: d\n"},
		{"null descriptors", "domain: d\ndescriptors:\n"},
		{"missing requests_per_unit is a zero rate", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n"},
		{"unlimited with requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n"},
		{"YAML 1.1 booleans", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n    detailed_metric: off\n"},
		{"numeric key and value", "domain: 42\ndescriptors:\n  - key: 7\n    value: 3.5\n"},
		{"empty value is a bare key", "domain: d\ndescriptors:\n  - key: k\n    value: \"\"\n"},
		{"anchors and aliases", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &rl {unit: second, requests_per_unit: 3}\n  - key: b\n    rate_limit: *rl\n"},
		{"both rate_limit and limits", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3, name: rpm}\n    limits: [{name: tpm, rate: 100/min, burst: 0, cost: hits}]\n"},
		{"share_threshold false anywhere", "domain: d\ndescriptors:\n  - key: k\n    share_threshold: false\n"},
		{"comment-only lines and documents", "---\ndomain: d\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := loadFiles(t, map[string]string{"a.yaml": tt.yaml}); err != nil {
				t.Fatalf("Load: %v", err)
			}
		})
	}
}

func TestReportedName(t *testing.T) {
	c := mustLoad(t, map[string]string{"a.yaml": `domain: d
descriptors:
  - key: unnamed
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: named
    rate_limit: {unit: second, requests_per_unit: 1, name: gold}
  - key: sluice
    limits: [{name: default, rate: 1/s}, {name: rpm, rate: 1/min}]
`})
	tests := []struct{ key, limit, want string }{
		{"unnamed", "default", ""},
		{"named", "gold", "gold"},
		{"sluice", "default", "default"}, // a limit really called "default" keeps its name
		{"sluice", "rpm", "rpm"},
	}
	for _, tt := range tests {
		m, ok := c.Match("d", desc(tt.key, "v"))
		if !ok {
			t.Fatalf("%s: no match", tt.key)
		}
		if !slices.ContainsFunc(m.Rule.Limits, func(l bucket.Limit) bool { return l.Name == tt.limit }) {
			t.Errorf("%s: no limit named %q in %v", tt.key, tt.limit, m.Rule.Limits)
		}
		if got := m.Rule.ReportedName(tt.limit); got != tt.want {
			t.Errorf("%s: ReportedName(%q) = %q, want %q", tt.key, tt.limit, got, tt.want)
		}
	}
}

// The example in doc.go must be valid.
func TestDocExample(t *testing.T) {
	c := mustLoad(t, map[string]string{"api.yaml": `domain: api
descriptors:
  - key: api_key
    limits:
      - {name: rpm, rate: 100/min, cost: request}
      - {name: tpm, rate: 40000/min, burst: 60000}
    descriptors:
      - key: model
        value: "gpt-*"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 10, name: per_model}
        resource: "chat:{model}"
`})
	m, ok := c.Match("api", desc("api_key", "k", "model", "gpt-4o"))
	if !ok || m.Entity != "k" || m.Resource != "chat:gpt-4o" || m.Rule.Limits[0].Name != "per_model" {
		t.Errorf("Match = %+v, %v", m, ok)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "domain: a\n")
	writeFile(t, dir, "b.YML", "domain: b\n")
	writeFile(t, dir, "notes.txt", "domain: not-yaml\n")
	writeFile(t, dir, ".hidden.yaml", "domain: hidden\n")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil { // a directory is not a file
		t.Fatal(err)
	}
	// Kubernetes ConfigMap layout: files are symlinks through "..data".
	if err := os.Mkdir(filepath.Join(dir, "..2026_01"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "..2026_01"), "c.yaml", "domain: c\n")
	mustSymlink(t, "..2026_01", filepath.Join(dir, "..data"))
	mustSymlink(t, "..data/c.yaml", filepath.Join(dir, "c.yaml"))

	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Domains() = %q, want [a b c]", got)
	}

	// The fingerprint depends on content only.
	c2, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Fingerprint() != c2.Fingerprint() || len(c.Fingerprint()) != 64 {
		t.Errorf("fingerprints %q, %q: want equal sha256 hex", c.Fingerprint(), c2.Fingerprint())
	}
	writeFile(t, dir, "a.yaml", "domain: a2\n")
	if c3, err := Load(dir); err != nil || c3.Fingerprint() == c.Fingerprint() {
		t.Errorf("fingerprint unchanged after an edit (err %v)", err)
	}

	// A dangling symlink is an error naming the file.
	mustSymlink(t, "missing.yaml", filepath.Join(dir, "d.yaml"))
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), "d.yaml") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dangling symlink: err = %v, want an error about d.yaml wrapping ErrNotExist", err)
	}

	if _, err := Load(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing dir: err = %v, want ErrNotExist", err)
	}
}

func TestParseMatchesLoad(t *testing.T) {
	files := map[string][]byte{"x.yaml": []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	p, err := Parse(files)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLoad(t, map[string]string{"x.yaml": string(files["x.yaml"])})
	if p.Fingerprint() != l.Fingerprint() {
		t.Errorf("Parse and Load of the same files differ in fingerprint")
	}
	if _, ok := p.Match("x", desc("k", "v")); !ok {
		t.Error("no match")
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
