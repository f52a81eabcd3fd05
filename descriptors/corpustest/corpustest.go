// Package corpustest reads the shared corpus of real envoyproxy/ratelimit
// rule files, for the tests that hold Sluice to that service's behaviour.
//
// The corpus lives beside the checkout, in ../shared/corpus (SLUICE_CORPUS
// names another place). It is read in place and never copied into the
// repository: the files are other people's. It holds the files
// (SOURCES.tsv says where each came from and whether envoyproxy/ratelimit
// loads it) and the cases of that service's own config tests
// (expectations.json).
//
// Without the corpus, Dir skips the test with a message; with CI=true it
// fails it instead, so a CI machine that lost the corpus does not pass in
// silence.
package corpustest

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// Dir returns the corpus directory, or skips t (fails it under CI=true)
// when there is none.
func Dir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SLUICE_CORPUS")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "..", "shared", "corpus")
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

// repoRoot is the checkout this package was built from.
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("corpustest: cannot tell where the repository is")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// File is one row of SOURCES.tsv.
type File struct {
	Name  string // path inside the corpus, e.g. "inline/x.yaml"
	Repo  string // where it came from
	Valid string // "yes": envoyproxy/ratelimit loads it alone; "no": refuses it
	Notes string
}

// Files lists the corpus's files.
func Files(t testing.TB, dir string) []File {
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
		t.Fatalf("SOURCES.tsv: %v", err)
	}
	var out []File
	for _, row := range rows[1:] {
		if len(row) < 6 {
			t.Fatalf("SOURCES.tsv: short row %q", row)
		}
		out = append(out, File{Name: row[0], Repo: row[1], Valid: row[4], Notes: row[5]})
	}
	return out
}

// Read returns one corpus file as Parse takes it: base name to content.
func Read(t testing.TB, dir, name string) map[string][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{filepath.Base(name): data}
}

// Case is one case of expectations.json: a request to one file's rules
// and what envoyproxy/ratelimit's own tests assert of its answer.
type Case struct {
	ID      int         `json:"id"`
	Test    string      `json:"test"`
	File    string      `json:"file"`
	Domain  string      `json:"domain"`
	Entries [][2]string `json:"entries"`
	// Load lists the files loaded together, when there are several (their
	// domains merged, envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
	Load     []string  `json:"load"`
	Override *Override `json:"override"`
	// Expect holds "result" ("limit", "no_limit" or "load_error") and the
	// fields the case asserts, in JSON form.
	Expect map[string]any `json:"expect"`
}

// Descriptor is the case's request descriptor: its entries, and its limit
// override when it has one.
func (c Case) Descriptor() *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, e := range c.Entries {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
	}
	if o := c.Override; o != nil {
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{
			RequestsPerUnit: o.RequestsPerUnit, Unit: typev3.RateLimitUnit(typev3.RateLimitUnit_value[o.Unit])}
	}
	return d
}

// Override is the limit a case's descriptor carries itself.
type Override struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
}

// String names the case in messages.
func (c Case) String() string {
	parts := make([]string, len(c.Entries))
	for i, e := range c.Entries {
		parts[i] = e[0] + "=" + e[1]
	}
	return strings.Join([]string{"case", strconv.Itoa(c.ID), c.Test, c.File, c.Domain, "[" + strings.Join(parts, ",") + "]"}, " ")
}

// Cases reads expectations.json.
func Cases(t testing.TB, dir string) []Case {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "expectations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []Case
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatalf("expectations.json: %v", err)
	}
	return cases
}

// RateLimitConfig reads a rule file as the RateLimitConfig resource an
// xDS server would send for it. It reports false for a file that uses a
// key the resource has no field for (value_to_metric, share_threshold,
// Sluice's own keys): over xDS such a file cannot be said.
func RateLimitConfig(t testing.TB, data []byte) (*rlconfv3.RateLimitConfig, bool) {
	t.Helper()
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	expressible := true
	var strip func(v any)
	strip = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				switch k {
				case "value_to_metric", "share_threshold":
					if e == true {
						expressible = false
					}
					delete(x, k)
				case "limits", "entity", "resource", "parent":
					expressible = false
				case "metadata":
					continue
				case "unit":
					if u, ok := e.(string); ok {
						x[k] = strings.ToUpper(u) // the enum's names; files take any case
					}
				case "key", "value", "name", "domain":
					if e != nil {
						x[k] = fmt.Sprint(e) // a file's `value: 500` is the string "500"
					}
				}
				strip(e)
			}
		case []any:
			for _, e := range x {
				strip(e)
			}
		}
	}
	strip(doc)
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var c rlconfv3.RateLimitConfig
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &c); err != nil {
		return nil, false // not the resource's shape (a value that is a number, say)
	}
	return &c, expressible
}
