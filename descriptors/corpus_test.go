package descriptors

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// corpusDir finds the shared corpus of real envoyproxy/ratelimit rule
// files (SLUICE_CORPUS, else ../shared/corpus beside the checkout). It is
// read in place, never copied into the repository. Absent, the tests that
// need it skip, except in CI (CI=true), where they fail.
func corpusDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SLUICE_CORPUS")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "corpus")
	}
	if _, err := os.Stat(filepath.Join(dir, "SOURCES.tsv")); err != nil {
		msg := "the corpus of envoyproxy/ratelimit rule files is not at " + dir +
			" (../shared/corpus beside the checkout, or SLUICE_CORPUS): " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// corpusFile is one row of the corpus's SOURCES.tsv.
type corpusFile struct {
	name, repo, valid, notes string
}

func corpusFiles(t *testing.T, dir string) []corpusFile {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "SOURCES.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comma, r.LazyQuotes, r.FieldsPerRecord = '\t', true, -1
	rows, err := r.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var out []corpusFile
	for _, row := range rows[1:] {
		if len(row) < 6 {
			t.Fatalf("SOURCES.tsv: short row %q", row)
		}
		out = append(out, corpusFile{name: row[0], repo: row[1], valid: row[4], notes: row[5]})
	}
	return out
}

func parseCorpusFile(t *testing.T, dir, name string) (*Config, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return Parse(map[string][]byte{filepath.Base(name): data})
}

// Every rule file people wrote for envoyproxy/ratelimit that it loads,
// Sluice loads; every one it refuses, Sluice refuses, with errors that
// each name the file and a line.
func TestCorpusLoadsAsEnvoyproxyDoes(t *testing.T) {
	dir := corpusDir(t)
	files := corpusFiles(t, dir)
	loaded, refused := 0, 0
	for _, f := range files {
		_, err := parseCorpusFile(t, dir, f.name)
		switch f.valid {
		case "yes":
			if err != nil {
				t.Errorf("%s (%s) loads in envoyproxy/ratelimit; Sluice refuses it:\n%v", f.name, f.repo, err)
				continue
			}
			loaded++
		case "no":
			if err == nil {
				t.Errorf("%s is refused by envoyproxy/ratelimit (%s); Sluice loads it", f.name, f.notes)
				continue
			}
			for _, e := range unjoin(err) {
				var de *Error
				if !errors.As(e, &de) || de.File != filepath.Base(f.name) || de.Line < 1 {
					t.Errorf("%s: error without its file and line: %v", f.name, e)
				}
			}
			refused++
		default:
			t.Errorf("SOURCES.tsv: %s has valid %q", f.name, f.valid)
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

// corpusCase is one case of the corpus's expectations.json: a request to
// one file's rules and what envoyproxy/ratelimit's own tests assert of
// its answer.
type corpusCase struct {
	ID       int         `json:"id"`
	Test     string      `json:"test"`
	File     string      `json:"file"`
	Domain   string      `json:"domain"`
	Entries  [][2]string `json:"entries"`
	Load     []string    `json:"load"`
	Override *struct {
		RequestsPerUnit uint32 `json:"requests_per_unit"`
		Unit            string `json:"unit"`
	} `json:"override"`
	Expect map[string]any `json:"expect"`
}

// Every case of envoyproxy/ratelimit's own config tests (and README
// examples) that one Sluice can be asked selects what that service
// selects: the limit or none, its rate and unit, its reported name,
// unlimited, shadow mode, detailed metrics, the metadata of the rule, the
// stats key its dashboards read. Cases Sluice cannot be asked are
// counted and named: several files merged into one domain (envoyproxy's
// MERGE_DOMAIN_CONFIG).
func TestCorpusCasesSelectAsEnvoyproxyDoes(t *testing.T) {
	dir := corpusDir(t)
	raw, err := os.ReadFile(filepath.Join(dir, "expectations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []corpusCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	asked, skipped := 0, map[string]int{}
	for _, c := range cases {
		if len(c.Load) > 1 {
			skipped["several files merged into one domain"]++
			continue
		}
		asked++
		cfg, err := parseCorpusFile(t, dir, c.File)
		what := func() string {
			return strings.Join([]string{c.Test, c.File, c.Domain}, " ") + " " + entriesString(c.Entries)
		}
		if c.Expect["result"] == "load_error" {
			if err == nil {
				t.Errorf("case %d (%s): envoyproxy/ratelimit refuses the file (%v); Sluice loads it", c.ID, what(), c.Expect["error_substring"])
			}
			continue
		}
		if err != nil {
			t.Errorf("case %d (%s): %v", c.ID, what(), err)
			continue
		}
		d := &rlv3.RateLimitDescriptor{}
		for _, e := range c.Entries {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
		}
		if o := c.Override; o != nil {
			d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: o.RequestsPerUnit, Unit: typev3.RateLimitUnit(typev3.RateLimitUnit_value[o.Unit])}
		}
		m, ok := cfg.Match(c.Domain, d)
		limited := ok && (len(m.Rule.Limits) > 0 || m.Rule.Unlimited)
		switch c.Expect["result"] {
		case "no_limit":
			if limited {
				t.Errorf("case %d (%s): no limit in envoyproxy/ratelimit; Sluice matched %s", c.ID, what(), m.Rule.Path)
			}
			continue
		case "limit":
			if !limited {
				t.Errorf("case %d (%s): a limit in envoyproxy/ratelimit; Sluice has none (matched: %v)", c.ID, what(), ok)
				continue
			}
		default:
			t.Fatalf("case %d: result %v", c.ID, c.Expect["result"])
		}
		for field, want := range c.Expect {
			if got, known := caseField(m, d, field); known && !reflect.DeepEqual(got, want) {
				t.Errorf("case %d (%s): %s is %#v in envoyproxy/ratelimit, %#v in Sluice (rule %s)", c.ID, what(), field, want, got, m.Rule.Path)
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

func entriesString(entries [][2]string) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e[0] + "=" + e[1]
	}
	return "[" + strings.Join(parts, ",") + "]"
}
