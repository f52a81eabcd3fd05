package descriptors

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// matchFuzzDomains hold the same tree (fuzzMatchTree), so that a request
// sent to both shows that the domain is part of every default identity.
var matchFuzzDomains = [2]string{"fz", "fz2"}

// fuzzMatchTree is the config FuzzMatch matches against: every kind of node
// (bare, exact, wildcards in file order, a wildcard's text as an exact
// value, share_threshold, templates, names and replaces, a whitelist node,
// keys and values with '*', '%', '#', '/' and non-ASCII). No key or value
// holds '_', so envoyproxy/ratelimit's "key_value" lookup is unambiguous on
// it (see envoyproxyLookup).
func fuzzMatchTree(domain string) []*genNode {
	n := func(key, value string, children ...*genNode) *genNode {
		return &genNode{key: key, value: value, limited: true, children: children}
	}
	share := func(g *genNode) *genNode { g.share = true; return g }
	tmpl := func(g *genNode, entity, resource, parent string) *genNode {
		g.entity, g.resource, g.parent = entity, resource, parent
		return g
	}
	carolBasic := n("user", "carol")
	carolBasic.name = "carol-basic"
	carolPremium := n("user", "carol")
	carolPremium.replaces = []string{"carol-basic"}
	plans := []*genNode{n("plan", "basic", carolBasic), n("plan", "premium", carolPremium, n("user", ""))}
	for _, p := range plans {
		p.limited = false
	}
	tenant := n("tenant", "",
		n("user", "", tmpl(n("model", ""), "{user}", "chat:{model}", "tenant:{tenant}")),
		tmpl(n("app", ""), "shared", "{tenant}/{app}-x", ""))
	tenant.limited = false
	top := []*genNode{
		n("org", "",
			n("user", ""),
			n("team", "core"),
			share(n("model", "gpt-*")),
			n("model", "claude-*"),
			n("model", "*")),
		n("path", "/api/*", n("method", "")),
		n("path", "/api/v1/*"), // after /api/*: reached only by its own text
		n("path", "/api/v1/status"),
		n("path", ""),
		n("name", "a*b*c"),
		n("name", "%2F"),
		n("name", "x/y"),
		n("name", "#"),
		share(n("name", "*%*")),
		tenant,
		n("everyone", "yes"),
		plans[0], plans[1],
		n("*", "*"),
		n("ключ", "знач*", n("ключ", "")),
		{key: "empty"}, // matches, limits nothing
	}
	var setPaths func(parent string, level []*genNode)
	setPaths = func(parent string, level []*genNode) {
		for _, g := range level {
			g.path = parent + "/" + g.key
			if g.value != "" {
				g.path += "=" + g.value
			}
			setPaths(g.path, g.children)
		}
	}
	setPaths(domain, top)
	return top
}

// matchFuzzKeys are the keys a fuzzed request picks its entries' keys from
// (4 bits each); the last slot takes a fuzzed key instead.
var matchFuzzKeys = [16]string{
	"org", "user", "team", "model", "path", "method", "name", "tenant",
	"app", "everyone", "plan", "*", "ключ", "empty", "nope", "",
}

// modelMatch is what a request should map to, by the rules docs/rules.md
// states ("Matching", "Bucket identity"), computed from the genNode tree
// without any of match.go's code.
type modelMatch struct {
	node                     *genNode
	entity, resource, parent string
	// values are the request values that make up a default entity: those
	// of bare levels and of wildcard levels without share_threshold.
	values []string
}

var escapeValue = strings.NewReplacer("%", "%25", "/", "%2F")

var placeholder = regexp.MustCompile(`\{([^{}]+)\}`)

func modelLookup(domain string, top []*genNode, d *rlv3.RateLimitDescriptor) (modelMatch, bool) {
	entries := d.GetEntries()
	if d.GetLimit() != nil {
		// The override's own bucket: every value in the entity, the keys
		// in the resource.
		resource, values := domain, []string{}
		for _, e := range entries {
			resource += "/" + escapeValue.Replace(e.GetKey())
			values = append(values, e.GetValue())
		}
		return modelMatch{entity: orEmpty(joinModel(values)), resource: resource + "/override", values: values}, true
	}
	var chain []*genNode
	level := top
	for i, e := range entries {
		next := pick(level, func(g *genNode) bool { return g.key == e.GetKey() && g.value != "" && g.value == e.GetValue() })
		if next == nil {
			next = pick(level, func(g *genNode) bool {
				return g.key == e.GetKey() && strings.Contains(g.value, "*") && wildcardRegexp("", g.value).MatchString(e.GetValue())
			})
		}
		if next == nil {
			next = pick(level, func(g *genNode) bool { return g.key == e.GetKey() && g.value == "" })
		}
		if next == nil || (i < len(entries)-1 && len(next.children) == 0) {
			return modelMatch{}, false
		}
		chain = append(chain, next)
		level = next.children
	}
	if len(chain) == 0 {
		return modelMatch{}, false
	}
	m := modelMatch{node: chain[len(chain)-1], resource: chain[len(chain)-1].path}
	for i, g := range chain {
		if g.value == "" || (strings.Contains(g.value, "*") && !g.share) {
			m.values = append(m.values, entries[i].GetValue())
		}
	}
	m.entity = joinModel(m.values)
	render := func(text string) string {
		return placeholder.ReplaceAllStringFunc(text, func(ph string) string {
			for i, g := range chain {
				if "{"+g.key+"}" == ph {
					return entries[i].GetValue()
				}
			}
			panic("placeholder " + ph + " not on the path")
		})
	}
	if m.node.entity != "" {
		m.entity = render(m.node.entity)
	}
	if m.node.resource != "" {
		m.resource = orEmpty(render(m.node.resource))
	}
	if m.node.parent != "" {
		m.parent = orEmpty(render(m.node.parent))
	}
	m.entity = orEmpty(m.entity)
	return m, true
}

// orEmpty is a bucket name as the docs state it: one that would be empty
// (an empty request value, a template that renders nothing) is "%empty".
func orEmpty(name string) string {
	if name == "" {
		return "%empty"
	}
	return name
}

func pick(level []*genNode, ok func(*genNode) bool) *genNode {
	for _, g := range level {
		if ok(g) {
			return g
		}
	}
	return nil
}

func joinModel(values []string) string {
	if len(values) == 0 {
		return "_global_"
	}
	esc := make([]string, len(values))
	for i, v := range values {
		esc[i] = escapeValue.Replace(v)
	}
	return strings.Join(esc, "/")
}

// matchFuzzRequest decodes one of FuzzMatch's two requests. shape holds
// the entry count (2 bits), three key choices (4 bits each), and at bit
// 14 the domain; rawKey fills key slot 15. FuzzMatch's shape holds the
// first request in bits 0-14, the second in bits 16-30; bit 15 gives the
// first a limit override, bit 31 gives the second the first one's keys.
func matchFuzzRequest(shape uint32, rawKey string, values [3]string) (string, *rlv3.RateLimitDescriptor) {
	d := &rlv3.RateLimitDescriptor{}
	for i := range int(shape & 3) {
		k := matchFuzzKeys[shape>>(2+4*i)&15]
		if shape>>(2+4*i)&15 == 15 {
			k = rawKey
		}
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: values[i]})
	}
	return matchFuzzDomains[shape>>14&1], d
}

// matchFuzzShape encodes a request for a seed: kv are key, value pairs
// (keys from matchFuzzKeys, or raw), at most three.
func matchFuzzShape(domain int, kv ...string) (shape uint32, raw string, values [3]string) {
	shape = uint32(len(kv)/2) | uint32(domain)<<14
	for i := 0; i+1 < len(kv); i += 2 {
		slot := slices.Index(matchFuzzKeys[:15], kv[i])
		if slot < 0 {
			slot, raw = 15, kv[i]
		}
		shape |= uint32(slot) << (2 + 4*(i/2))
		values[i/2] = kv[i+1]
	}
	return shape, raw, values
}

// FuzzMatch compares Match with modelLookup on two fuzzed requests against
// a fixed config, and checks what a user relies on for bucket identity:
// the same rule and the same identifying values give the same bucket,
// different values never do (whatever '/' and '%' they hold) except at a
// share_threshold level, and no request reaches another rule's bucket.
func FuzzMatch(f *testing.F) {
	seeds := [][2][]string{
		{{"org", "a/b", "user", "c"}, {"org", "a", "user", "b/c"}},
		{{"org", "50%", "user", "%2F"}, {"org", "50%25", "user", "/"}},
		{{"org", "k", "model", "gpt-4"}, {"org", "k", "model", "gpt-5"}},
		{{"org", "k", "model", "claude-1"}, {"org", "k", "model", "claude-2"}},
		{{"org", "k", "model", "gpt-*"}, {"org", "k", "model", "llama"}},
		{{"org", "k", "team", "core"}, {"org", "k", "team", "ops"}},
		{{"path", "/api/v1/status"}, {"path", "/api/v1/x"}},
		{{"path", "/api/v1/*"}, {"path", "/api/x", "method", "GET"}},
		{{"path", "/web"}, {"path", ""}},
		{{"name", "a-b-c"}, {"name", "abc"}},
		{{"name", "%2F"}, {"name", "/"}},
		{{"name", "x/y"}, {"name", "x%2Fy"}},
		{{"name", "#"}, {"name", "%#%"}},
		{{"tenant", "t/1", "user", "u", "model", "m"}, {"tenant", "t", "user", "1/u", "model", "m"}},
		{{"tenant", "t", "app", "a/b"}, {"tenant", "t/a", "app", "b"}},
		{{"everyone", "yes"}, {"everyone", "no"}},
		{{"plan", "premium", "user", "carol"}, {"plan", "basic", "user", "carol"}},
		{{"plan", "premium", "user", "dave"}, {"plan", "premium"}},
		{{"*", "*"}, {"*", "x"}},
		{{"ключ", "значение", "ключ", "\xff"}, {"ключ", "знач", "ключ", ""}},
		{{"empty", ""}, {"empty", "x"}},
		{{"a_b", "c"}, {"org", "x", "user", "y", "nope", "z"}},
		{{"org", strings.Repeat("/", 300)}, {"org", strings.Repeat("%2F", 100)}},
		{{}, {"org", ""}},
	}
	add := func(domA, domB int, flags uint32, overrideB bool, s [2][]string) {
		sa, raw, va := matchFuzzShape(domA, s[0]...)
		sb, rawB, vb := matchFuzzShape(domB, s[1]...)
		if raw == "" {
			raw = rawB
		}
		f.Add(sa|sb<<16|flags, overrideB, raw, va[0], va[1], va[2], vb[0], vb[1], vb[2])
	}
	for i, s := range seeds {
		add(i%2, i%2, 0, false, s)
	}
	add(0, 1, 0, false, seeds[0])                // one request, two domains
	add(1, 0, 1<<31, false, seeds[13])           // B takes A's keys
	add(0, 0, 1<<15, false, seeds[0])            // an override beside a rule
	add(0, 0, 1<<15, false, [2][]string{{}, {}}) // an override without entries
	add(0, 0, 1<<15|1<<31, true, seeds[0])       // two overrides, one key list
	// Overrides on keys that hold a '/': the model escapes them in the
	// resource, so that ("a/b","c") and ("a","b/c") stay two buckets.
	add(0, 0, 1<<15, true, [2][]string{{"org/user", "x", "team", "y"}, {"org", "x", "user", "y", "team", "z"}})
	trees := map[string][]*genNode{}
	files := map[string][]byte{}
	for _, dom := range matchFuzzDomains {
		trees[dom] = fuzzMatchTree(dom)
		var src strings.Builder
		fmt.Fprintf(&src, "domain: %s\ndescriptors:\n", dom)
		writeGenNodes(&src, trees[dom], "  ")
		files[dom+".yaml"] = []byte(src.String())
	}
	c, err := Parse(files)
	if err != nil {
		f.Fatalf("the fixed config: %v\n%s", err, files["fz.yaml"])
	}

	f.Fuzz(func(t *testing.T, shape uint32, overrideB bool, rawKey, v1, v2, v3, w1, w2, w3 string) {
		shapeB := shape >> 16 & 0x7fff
		if shape&(1<<31) != 0 {
			// The second request takes the first one's keys, so that the
			// two often reach one rule with different values.
			shapeB = shape&0x3fff | shapeB&(1<<14)
		}
		domA, a := matchFuzzRequest(shape&0x7fff, rawKey, [3]string{v1, v2, v3})
		domB, b := matchFuzzRequest(shapeB, rawKey, [3]string{w1, w2, w3})
		// Envoy's limit override, on either request or both.
		override := &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND}
		if shape&(1<<15) != 0 {
			a.Limit = override
		}
		if overrideB {
			b.Limit = override
		}
		ma, wa, oka := checkMatch(t, c, trees, domA, a)
		mb, wb, okb := checkMatch(t, c, trees, domB, b)
		if !oka || !okb {
			return
		}
		sameBucket := ma.Entity == mb.Entity && ma.Resource == mb.Resource
		if wa.node == wb.node && wa.node != nil && wa.node.entity == "" && wa.node.resource == "" {
			// One rule, default identity: one bucket exactly when the
			// identifying values are the same.
			if sameValues := slices.Equal(wa.values, wb.values); sameBucket != sameValues {
				t.Fatalf("rule %s: %v and %v: same values %v, but same bucket %v (%q, %q)",
					wa.node.path, a.GetEntries(), b.GetEntries(), sameValues, sameBucket, ma.Entity, mb.Entity)
			}
		}
		if wa.node != wb.node && sameBucket && (wa.node == nil || wb.node == nil || wa.node.resource == "" || wb.node.resource == "") {
			// Only two resource templates may name one resource (the
			// operator's choice); a rule's path is its own.
			t.Fatalf("%s %v and %s %v reach different rules but share the bucket (%q, %q)",
				domA, a.GetEntries(), domB, b.GetEntries(), ma.Entity, ma.Resource)
		}
	})
}

// checkMatch matches d twice (the answer must not change) and compares it
// with modelLookup and, where its lookup is unambiguous, envoyproxyLookup.
func checkMatch(t *testing.T, c *Config, trees map[string][]*genNode, domain string, d *rlv3.RateLimitDescriptor) (Match, modelMatch, bool) {
	t.Helper()
	m, ok := c.Match(domain, d)
	again, ok2 := c.Match(domain, d)
	if ok != ok2 || m.Entity != again.Entity || m.Resource != again.Resource || m.Parent != again.Parent ||
		(ok && m.Rule.Path != again.Rule.Path) {
		t.Fatalf("Match(%s, %v) is not deterministic: %+v, then %+v", domain, d.GetEntries(), m, again)
	}
	want, wok := modelLookup(domain, trees[domain], d)
	if ok != wok {
		t.Fatalf("Match(%s, %v) ok=%v, model %v (%+v)", domain, d.GetEntries(), ok, wok, want)
	}
	// envoyproxy/ratelimit joins key and value with '_'; without one in
	// the request its lookup must pick the same rule.
	if d.GetLimit() == nil && !slices.ContainsFunc(d.GetEntries(), func(e *rlv3.RateLimitDescriptor_Entry) bool {
		return strings.Contains(e.GetKey()+e.GetValue(), "_")
	}) {
		got := ""
		if ok {
			got = m.Rule.Path
		}
		if want := envoyproxyLookup(trees[domain], d); got != want {
			t.Fatalf("Match(%s, %v) = rule %q, envoyproxy/ratelimit's lookup %q", domain, d.GetEntries(), got, want)
		}
	}
	if !ok {
		return m, want, false
	}
	// An override's keys are request data: its rule, a label of metrics
	// and logs, is named by the domain alone.
	wantPath := domain + "/override"
	if want.node != nil {
		wantPath = want.node.path
	}
	if m.Rule.Path != wantPath || m.Entity != want.entity || m.Resource != want.resource || m.Parent != want.parent {
		t.Fatalf("Match(%s, %v) = rule %s entity %q resource %q parent %q; model: rule %s entity %q resource %q parent %q",
			domain, d.GetEntries(), m.Rule.Path, m.Entity, m.Resource, m.Parent, wantPath, want.entity, want.resource, want.parent)
	}
	if g := want.node; g != nil {
		if m.Rule.Name != g.name || !slices.Equal(m.Rule.Replaces, g.replaces) || (len(m.Rule.Limits) > 0) != g.limited {
			t.Fatalf("rule %s: name %q replaces %q limits %v; want %q %q limited=%v",
				g.path, m.Rule.Name, m.Rule.Replaces, m.Rule.Limits, g.name, g.replaces, g.limited)
		}
	}
	return m, want, true
}
