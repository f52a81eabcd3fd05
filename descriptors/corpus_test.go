package descriptors

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/descriptors/corpustest"
)

func parseCorpusFile(t *testing.T, dir, name string) (*Config, error) {
	t.Helper()
	return Parse(corpustest.Read(t, dir, name))
}

// Every rule file people wrote for envoyproxy/ratelimit that it loads,
// Sluice loads; every one it refuses, Sluice refuses, with errors that
// each name the file and a line.
func TestCorpusLoadsAsEnvoyproxyDoes(t *testing.T) {
	dir := corpustest.Dir(t)
	loaded, refused := 0, 0
	for _, f := range corpustest.Files(t, dir) {
		_, err := parseCorpusFile(t, dir, f.Name)
		switch f.Valid {
		case "yes":
			if err != nil {
				t.Errorf("%s (%s) loads in envoyproxy/ratelimit; Sluice refuses it:\n%v", f.Name, f.Repo, err)
				continue
			}
			loaded++
		case "no":
			if err == nil {
				t.Errorf("%s is refused by envoyproxy/ratelimit (%s); Sluice loads it", f.Name, f.Notes)
				continue
			}
			for _, e := range unjoin(err) {
				var de *Error
				if !errors.As(e, &de) || de.File != filepath.Base(f.Name) || de.Line < 1 {
					t.Errorf("%s: error without its file and line: %v", f.Name, e)
				}
			}
			refused++
		default:
			t.Errorf("SOURCES.tsv: %s has valid %q", f.Name, f.Valid)
		}
	}
	t.Logf("%d files loaded, %d refused, as envoyproxy/ratelimit does", loaded, refused)
	if loaded < 60 || refused < 10 {
		t.Errorf("only %d loaded and %d refused: the corpus is not what this test expects", loaded, refused)
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Every case of envoyproxy/ratelimit's own config tests (and README
// examples) that one Sluice can be asked selects what that service
// selects: the limit or none, its rate and unit, its reported name,
// unlimited, shadow mode, detailed metrics, the metadata of the rule, the
// stats key its dashboards read. Cases Sluice cannot be asked are
// counted and named: several files merged into one domain (envoyproxy's
// MERGE_DOMAIN_CONFIG).
func TestCorpusCasesSelectAsEnvoyproxyDoes(t *testing.T) {
	dir := corpustest.Dir(t)
	cases := corpustest.Cases(t, dir)
	asked, skipped := 0, map[string]int{}
	for _, c := range cases {
		if len(c.Load) > 1 {
			skipped["several files merged into one domain"]++
			continue
		}
		asked++
		cfg, err := parseCorpusFile(t, dir, c.File)
		if c.Expect["result"] == "load_error" {
			if err == nil {
				t.Errorf("%v: envoyproxy/ratelimit refuses the file (%v); Sluice loads it", c, c.Expect["error_substring"])
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", c, err)
			continue
		}
		d := c.Descriptor()
		m, ok := cfg.Match(c.Domain, d)
		limited := ok && (len(m.Rule.Limits) > 0 || m.Rule.Unlimited)
		switch c.Expect["result"] {
		case "no_limit":
			if limited {
				t.Errorf("%v: no limit in envoyproxy/ratelimit; Sluice matched %s", c, m.Rule.Path)
			}
			continue
		case "limit":
			if !limited {
				t.Errorf("%v: a limit in envoyproxy/ratelimit; Sluice has none (matched: %v)", c, ok)
				continue
			}
		default:
			t.Fatalf("case %d: result %v", c.ID, c.Expect["result"])
		}
		for field, want := range c.Expect {
			if got, known := caseField(m, d, field); known && !reflect.DeepEqual(got, want) {
				t.Errorf("%v: %s is %#v in envoyproxy/ratelimit, %#v in Sluice (rule %s)", c, field, want, got, m.Rule.Path)
			}
		}
	}
	t.Logf("%d of %d cases asked; not asked: %v", asked, len(cases), skipped)
	if asked < 100 {
		t.Errorf("only %d cases asked", asked)
	}
}

// caseField is what Sluice's match says of one field envoyproxy/ratelimit's
// tests assert, in the JSON form of expectations.json; known is false for
// the fields that are not Sluice's to answer (the shape of that service's
// internal maps, its domain_not_found counters) or are asserted elsewhere
// (result).
func caseField(m Match, d *rlv3.RateLimitDescriptor, field string) (got any, known bool) {
	r := m.Rule
	switch field {
	case "requests_per_unit", "unit":
		if len(r.Limits) == 0 {
			return nil, true
		}
		l := r.Limits[0]
		if field == "unit" {
			return unitName(l.Period), true
		}
		return float64(l.Amount / bucket.Milli), true
	case "name":
		if len(r.Limits) == 0 {
			return "", true
		}
		return r.ReportedName(r.Limits[0].Name), true
	case "unlimited":
		return r.Unlimited, true
	case "shadow_mode":
		return r.ShadowMode, true
	case "detailed_metric":
		return r.DetailedMetric, true
	case "stats_key", "full_key":
		return r.StatsKey(d.GetEntries()), true
	case "metadata":
		return r.Metadata, true
	}
	return nil, false
}

func unitName(period int64) string {
	for _, u := range []struct {
		name string
		ms   int64
	}{{"SECOND", bucket.Second}, {"MINUTE", bucket.Minute}, {"HOUR", bucket.Hour}, {"DAY", bucket.Day},
		{"WEEK", bucket.Week}, {"MONTH", bucket.Month}, {"YEAR", bucket.Year}} {
		if period == u.ms {
			return u.name
		}
	}
	return "?"
}
