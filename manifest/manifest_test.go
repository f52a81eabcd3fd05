package manifest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

func limit(t *testing.T, s string) bucket.Limit {
	t.Helper()
	l, err := bucket.ParseLimit(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestParse(t *testing.T) {
	m, err := Parse("limits.yaml", []byte(`
entities:
  acme:
    chat:
      - {name: rpm, rate: 200/min}
    _default_:
      - {name: rpm, rate: 500/min, burst: 600}
resources:
  chat:
    - {name: rpm, rate: 20/min, cost: request}
    - {name: tpm, rate: 40000/min, burst: 60000}
system:
  - {name: rpm, rate: 1000/min}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range m.Records {
		var ls []string
		for _, l := range r.Limits {
			ls = append(ls, l.String())
		}
		got = append(got, r.Key.String()+": "+strings.Join(ls, " "))
	}
	want := []string{
		`system: rpm=1000/min`,
		`resource "chat": rpm=20/min:cost=request tpm=40000/min:burst=60000`,
		`entity "acme" resource "_default_": rpm=500/min:burst=600`,
		`entity "acme" resource "chat": rpm=200/min`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for _, empty := range []string{"", "# nothing\n", "{}"} {
		if m, err := Parse("x", []byte(empty)); err != nil || len(m.Records) != 0 {
			t.Errorf("Parse(%q) = %v, %v; want no records", empty, m, err)
		}
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"sytem:\n  - {name: a, rate: 1/s}\n", `x.yaml:1: unknown key "sytem"`},
		{"system: {name: a, rate: 1/s}\n", "x.yaml:1: system: want a list of limits"},
		{"system: []\n", "x.yaml:1: system: want a list of limits"},
		{"system:\n  - {name: a, rate: 1/fortnight}\n", `x.yaml:2: system: limit "a": rate "1/fortnight"`},
		{"system:\n  - {name: a, rate: 1/s, ttl: 5}\n", `x.yaml:2: system: unknown key "ttl" in a limit`},
		{"system:\n  - {name: a, rate: 1/s}\n  - {name: a, rate: 2/s}\n", `x.yaml:3: system: limit "a" given twice`},
		{"system:\n  - {name: a, rate: 1/s, cost: tokens}\n", `cost "tokens"`},
		{"system:\n  - {name: a, rate: 1/s, burst: -1}\n", "burst must be a whole number"},
		{"system:\n  - rpm=1/s\n", "x.yaml:2: system: want a limit {name, rate, burst, cost}"},
		{"resources:\n  - chat\n", "x.yaml:2: resources: want a mapping of names"},
		{"resources:\n  chat:\n    - {name: a, rate: 1/s}\n  chat:\n    - {name: a, rate: 1/s}\n", `x.yaml:4: resources: "chat" given twice`},
		{"resources:\n  \"\":\n    - {name: a, rate: 1/s}\n", "x.yaml:2: resources: want a non-empty name"},
		{"entities:\n  acme:\n    - {name: a, rate: 1/s}\n", "x.yaml:3: entity acme: want a mapping of names"},
		{"entities:\n  acme:\n    chat:\n      - {name: a}\n", `x.yaml:4: entity acme resource chat: limit "a": rate ""`},
		{"- a\n", "x.yaml:1: want a mapping"},
		{"system: [\n", "x.yaml: yaml:"},
		{"system:\n  - {name: a, rate: 1/s}\n---\nsystem: []\n", "x.yaml:3: a manifest is one YAML document"},
	} {
		_, err := Parse("x.yaml", []byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v; want an error containing %q", c.in, err, c.want)
		}
	}
	// Every problem of a file at once.
	_, err := Parse("x.yaml", []byte("system:\n  - {name: a, rate: 1/x}\nresources:\n  r:\n    - {name: b, rate: 1/q}\n"))
	if err == nil || !strings.Contains(err.Error(), "x.yaml:2:") || !strings.Contains(err.Error(), "x.yaml:5:") {
		t.Errorf("two bad limits: %v; want both lines", err)
	}
}

func TestPlan(t *testing.T) {
	rpm100, rpm200, tpm := limit(t, "rpm=100/min"), limit(t, "rpm=200/min"), limit(t, "tpm=1000/min:burst=2000")
	sys, chat := backend.SystemKey(), backend.ResourceKey("chat")
	acme, acmeChat := backend.EntityKey("acme", backend.DefaultResource), backend.EntityKey("acme", "chat")
	hand := backend.EntityKey("vip", backend.DefaultResource)
	m := &Manifest{Records: []Record{
		{sys, []bucket.Limit{rpm100}},
		{chat, []bucket.Limit{rpm100, tpm}},
		{acme, []bucket.Limit{rpm200}},
		{acmeChat, []bucket.Limit{rpm100}},
	}}
	current := map[backend.RecordKey]Current{
		sys:  {Limits: []bucket.Limit{rpm100}},
		chat: {Limits: []bucket.Limit{tpm, rpm100}}, // same set, other order
		acme: {Limits: []bucket.Limit{rpm100}},
		// acmeChat is missing.
		backend.ResourceKey("old"): {Limits: []bucket.Limit{rpm100}},
		hand:                       {Limits: []bucket.Limit{rpm100}},
	}
	applied := []backend.RecordKey{sys, backend.ResourceKey("old"), backend.ResourceKey("gone-already"), chat}
	var got []string
	for _, c := range Plan(m, current, applied) {
		got = append(got, fmt.Sprintf("%s %s", c.Action, c.Key))
	}
	want := []string{
		`unchanged system`,
		`unchanged resource "chat"`,
		`update entity "acme" resource "_default_"`,
		`create entity "acme" resource "chat"`,
		`delete resource "old"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("plan\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A sync-written record the manifest declares becomes an operator
	// record: same limits, still an update (its ttl must go).
	current[acme] = Current{Limits: []bucket.Limit{rpm200}, Synced: true}
	if c := Plan(m, current, nil)[2]; c.Action != Update {
		t.Errorf("synced record with the declared limits: %v, want update", c.Action)
	}
}

// Applying a plan and planning again finds nothing to do, whatever the
// manifest, the table and the last applied set: apply is idempotent.
func TestPropertyPlanThenApplyIsAFixedPoint(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	pool := []backend.RecordKey{
		backend.SystemKey(), backend.ResourceKey("a"), backend.ResourceKey("b"),
		backend.EntityKey("e", "a"), backend.EntityKey("e", backend.DefaultResource), backend.EntityKey("f", "b"),
	}
	limits := [][]bucket.Limit{
		{limit(t, "rpm=1/s")}, {limit(t, "rpm=2/s")}, {limit(t, "rpm=1/s"), limit(t, "tpm=9/min")},
	}
	pick := func() map[backend.RecordKey]bool {
		s := map[backend.RecordKey]bool{}
		for _, k := range pool {
			if r.IntN(2) == 0 {
				s[k] = true
			}
		}
		return s
	}
	for range 2000 {
		m := &Manifest{}
		for _, k := range pool {
			if r.IntN(2) == 0 {
				m.Records = append(m.Records, Record{k, limits[r.IntN(len(limits))]})
			}
		}
		table := map[backend.RecordKey]Current{}
		for k := range pick() {
			table[k] = Current{Limits: limits[r.IntN(len(limits))], Synced: r.IntN(3) == 0}
		}
		var applied []backend.RecordKey
		for k := range pick() {
			applied = append(applied, k)
		}
		// Execute the plan on the model table.
		for _, c := range Plan(m, table, applied) {
			switch c.Action {
			case Create, Update:
				table[c.Key] = Current{Limits: c.New}
			case Delete:
				if !slices.Contains(applied, c.Key) {
					t.Fatalf("deleted %s, which no apply wrote", c.Key)
				}
				delete(table, c.Key)
			}
		}
		for _, rec := range m.Records {
			if cur, ok := table[rec.Key]; !ok || bucket.Fingerprint(cur.Limits) != bucket.Fingerprint(rec.Limits) || cur.Synced {
				t.Fatalf("after the plan, %s holds %+v, want %v", rec.Key, cur, rec.Limits)
			}
		}
		for _, c := range Plan(m, table, m.Keys()) {
			if c.Action != Unchanged {
				t.Fatalf("second plan: %s %s", c.Action, c.Key)
			}
		}
	}
}
