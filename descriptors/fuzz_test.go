package descriptors

import (
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// FuzzParse asserts that no input makes Parse or Match panic, and that
// what Parse accepts is consistent.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("testdata/envoyproxy.yaml"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(identityYAML))
	f.Add([]byte("domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: '*a**b*'\n    entity: '{k}-{k}'\n"))
	f.Add([]byte("domain: [\n"))
	f.Add([]byte("\x00\xff"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    limits: [{name: a, rate: 0/1ms}]\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a=b\n    value: c\n  - key: a\n    value: b=c\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(map[string][]byte{"f.yaml": data})
		if err != nil {
			if !strings.Contains(err.Error(), "f.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		paths := map[string]bool{}
		for _, r := range c.Rules() {
			if paths[r.Path] {
				t.Fatalf("two rules share the path %q", r.Path)
			}
			paths[r.Path] = true
			if !strings.HasPrefix(r.Path, r.Domain+"/") {
				t.Fatalf("rule path %q outside its domain %q", r.Path, r.Domain)
			}
			for _, l := range r.Limits {
				if err := l.Validate(); err != nil {
					t.Fatalf("rule %s: %v", r.Path, err)
				}
			}
			req, reachable := requestFor(c, r)
			m, ok := c.Match(r.Domain, req)
			if reachable && (!ok || m.Rule != r) {
				t.Fatalf("the path of rule %q (line %d) does not select it", r.Path, r.Line)
			}
		}
	})
}

// requestFor builds a descriptor along the path of r: for each level the
// node's own value, which selects it (a wildcard's text too, since the exact
// lookup comes first), or "v" for a bare key. Through a bare key a sibling
// may win, so the request is certain to reach r only without bare levels.
func requestFor(c *Config, r *Rule) (d *rlv3.RateLimitDescriptor, certain bool) {
	d, certain = &rlv3.RateLimitDescriptor{}, true
	for _, n := range chainTo(c.domains[r.Domain], r) {
		v := n.value
		if n.kind == kindBare {
			v, certain = "v", false
		}
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: n.key, Value: v})
	}
	return d, certain
}

// chainTo returns the nodes from the top level down to r.
func chainTo(l level, r *Rule) []*Rule {
	for _, k := range l {
		nodes := []*Rule{k.bare}
		for _, n := range k.exact {
			nodes = append(nodes, n)
		}
		for _, n := range nodes {
			if n == nil {
				continue
			}
			if n == r {
				return []*Rule{n}
			}
			if sub := chainTo(n.children, r); sub != nil {
				return append([]*Rule{n}, sub...)
			}
		}
	}
	return nil
}

func TestAliasBomb(t *testing.T) {
	// Each list holds ten nodes whose children are the previous list: eight
	// lists describe 10^8 nodes in a few kilobytes.
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 8 {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n", i, i)
		for j := range 10 {
			fmt.Fprintf(&b, "      - key: k%d\n", j)
			if i > 0 {
				fmt.Fprintf(&b, "        descriptors: *l%d\n", i-1)
			}
		}
	}
	start := time.Now()
	_, err := Parse(map[string][]byte{"bomb.yaml": []byte(b.String())})
	if err == nil || !strings.Contains(err.Error(), "bomb.yaml: file too large") {
		t.Errorf("err = %v, want file too large", err)
	}
	// Expanding 10^8 nodes would take many minutes; the refusal takes
	// milliseconds, and 30 s leaves room for -race on a loaded machine.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v", d)
	}
}

// genNode is a node of a generated config, kept beside the YAML so that
// the reference matchers can walk it. The fields after children are for
// the fixed configs of FuzzMatch; the random configs leave them empty.
type genNode struct {
	key, value string
	path       string
	children   []*genNode

	limited                  bool   // has a rate_limit
	name                     string // rate_limit.name
	replaces                 []string
	share                    bool // share_threshold
	entity, resource, parent string
}

// writeGenNodes writes level as the YAML of a descriptors list.
func writeGenNodes(b *strings.Builder, level []*genNode, indent string) {
	for _, n := range level {
		fmt.Fprintf(b, "%s- key: %q\n", indent, n.key)
		if n.value != "" {
			fmt.Fprintf(b, "%s  value: %q\n", indent, n.value)
		}
		if n.limited {
			fmt.Fprintf(b, "%s  rate_limit: {unit: minute, requests_per_unit: 10", indent)
			if n.name != "" {
				fmt.Fprintf(b, ", name: %q", n.name)
			}
			if len(n.replaces) > 0 {
				var names []string
				for _, r := range n.replaces {
					names = append(names, fmt.Sprintf("{name: %q}", r))
				}
				fmt.Fprintf(b, ", replaces: [%s]", strings.Join(names, ", "))
			}
			b.WriteString("}\n")
		}
		if n.share {
			fmt.Fprintf(b, "%s  share_threshold: true\n", indent)
		}
		for _, t := range []struct{ key, text string }{{"entity", n.entity}, {"resource", n.resource}, {"parent", n.parent}} {
			if t.text != "" {
				fmt.Fprintf(b, "%s  %s: %q\n", indent, t.key, t.text)
			}
		}
		if len(n.children) > 0 {
			fmt.Fprintf(b, "%s  descriptors:\n", indent)
			writeGenNodes(b, n.children, indent+"    ")
		}
	}
}

// TestMatchesEnvoyproxyAlgorithm compares Match with an independent model of
// envoyproxy/ratelimit's documented lookup (one map of "key_value" and "key" per level,
// wildcards tried in file order between the two, descend while the node has
// children, a rule only at the last entry) on random configs and requests.
func TestMatchesEnvoyproxyAlgorithm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b"}
	values := []string{"", "x", "y", "xy", "x*", "*y", "x*y", "*", "y*x"}
	reqValues := []string{"", "x", "y", "xy", "xxy", "yx", "x*", "*", "q"}

	var gen func(depth int, parentPath string) []*genNode
	gen = func(depth int, parentPath string) []*genNode {
		var level []*genNode
		seen := map[string]bool{}
		for range rng.IntN(5) {
			n := &genNode{key: keys[rng.IntN(len(keys))], value: values[rng.IntN(len(values))]}
			if seen[n.key+"_"+n.value] {
				continue
			}
			seen[n.key+"_"+n.value] = true
			n.path = parentPath + "/" + n.key
			if n.value != "" {
				n.path += "=" + n.value
			}
			if depth < 3 && rng.IntN(2) == 0 {
				n.children = gen(depth+1, n.path)
			}
			level = append(level, n)
		}
		return level
	}
	for iter := range 300 {
		top := gen(0, "g")
		var b strings.Builder
		b.WriteString("domain: g\ndescriptors:\n")
		writeGenNodes(&b, top, "  ")
		c, err := Parse(map[string][]byte{"g.yaml": []byte(b.String())})
		if err != nil {
			t.Fatalf("config %d: %v\n%s", iter, err, b.String())
		}
		for range 30 {
			d := &rlv3.RateLimitDescriptor{}
			for range 1 + rng.IntN(4) {
				d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{
					Key: keys[rng.IntN(len(keys))], Value: reqValues[rng.IntN(len(reqValues))]})
			}
			want := envoyproxyLookup(top, d)
			m, ok := c.Match("g", d)
			got := ""
			if ok {
				got = m.Rule.Path
			}
			if got != want {
				t.Fatalf("config:\n%s\nrequest %v: Match %q, envoyproxy %q", b.String(), d.GetEntries(), got, want)
			}
		}
	}
}

// envoyproxyLookup returns the path of the node envoyproxy/ratelimit stops
// at for d ("" for none), whether or not that node has a limit.
func envoyproxyLookup(top []*genNode, d *rlv3.RateLimitDescriptor) string {
	level := top
	for i, e := range d.Entries {
		byKey := map[string]*genNode{}
		var wildcards []*genNode
		for _, n := range level {
			fk := n.key
			if n.value != "" {
				fk += "_" + n.value
			}
			byKey[fk] = n
			if strings.Contains(n.value, "*") {
				wildcards = append(wildcards, n)
			}
		}
		next := byKey[e.Key+"_"+e.Value]
		if next == nil {
			for _, w := range wildcards {
				re := wildcardRegexp(w.key+"_", w.value)
				if re.MatchString(e.Key + "_" + e.Value) {
					next = w
					break
				}
			}
		}
		if next == nil {
			next = byKey[e.Key]
		}
		if next == nil {
			return ""
		}
		if i == len(d.Entries)-1 {
			return next.path
		}
		if len(next.children) == 0 {
			return ""
		}
		level = next.children
	}
	return ""
}

// wildcardRegexp compiles literal text followed by a value pattern whose
// '*'s match any run of bytes (newlines included, as envoyproxy/ratelimit's
// prefix and suffix tests do): a reference for pattern.match that shares no
// code with it. Only the value is a pattern; a '*' in a key is literal.
func wildcardRegexp(literal, pattern string) *regexp.Regexp {
	return regexp.MustCompile("(?s)^" + regexp.QuoteMeta(literal) + strings.ReplaceAll(regexp.QuoteMeta(pattern), `\*`, ".*") + "$")
}
