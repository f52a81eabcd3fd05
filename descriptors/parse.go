package descriptors

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Bounds on what one file may make the parser do. YAML aliases can make a
// small file describe a huge (or, through an alias to an ancestor, endless)
// tree, and the config is read on every reload: these keep a hostile or
// broken file from costing more than a bounded amount of work.
const (
	maxDepth = 64 // descriptor nesting levels
	// maxWork counts mapping entries and list items visited, aliases
	// expanded: about 50,000 descriptor nodes with a rate_limit each, far
	// beyond any real config, and a fraction of a second to parse.
	maxWork = 300_000
)

// parse builds a Config from files, whose fingerprint is fp. Files are read
// in name order, so "the first file" of a duplicate domain is stable.
func parse(files map[string][]byte, fp string) (*Config, error) {
	c := &Config{domains: make(map[string]level), names: make(map[string]string), fingerprint: fp}
	definedIn := make(map[string]string) // domain -> file
	var errs []error
	for _, name := range sortedNames(files) {
		p := &fileParser{file: name}
		p.parseFile(files[name])
		errs = append(errs, p.errs...)
		if p.domain == "" {
			continue
		}
		if first, dup := definedIn[p.domain]; dup {
			errs = append(errs, &Error{File: name, Line: p.domainLine,
				Msg: fmt.Sprintf("duplicate domain %q (already defined in %s)", p.domain, first)})
			continue
		}
		definedIn[p.domain] = name
		c.domains[p.domain] = p.root
		if p.name != "" {
			c.names[p.domain] = p.name
		}
		c.rules = append(c.rules, p.rules...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for d := range c.domains {
		c.domainNames = append(c.domainNames, d)
	}
	slices.Sort(c.domainNames)
	return c, nil
}

// fileParser walks the yaml.Node tree of one file. It keeps going after an
// error so that one load reports every problem of the file.
type fileParser struct {
	file string
	errs []error
	work int
	stop bool // a bound was hit: abandon the walk

	domain     string
	domainLine int
	name       string // the top-level name (Envoy Gateway writes one), or ""
	root       level
	rules      []*Rule
	paths      map[string]int            // the line of the node that has each path
	zones      map[string]*time.Location // loaded once per file (calendar)
}

func (p *fileParser) errorf(line int, format string, args ...any) {
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)})
}

func (p *fileParser) parseFile(data []byte) {
	var doc yaml.Node
	if err := unmarshal(data, &doc); err != nil {
		p.yamlError(err)
		return
	}
	if len(doc.Content) == 0 {
		p.errorf(1, "empty file: want a mapping with domain and descriptors")
		return
	}
	root := p.deref(doc.Content[0])
	if root == nil || !p.isMapping(root, "file") {
		return
	}
	f := p.fields(root, "the top level", "domain", "descriptors", "name")
	domain, ok := p.requiredString(root, f, "domain", "file")
	if !ok {
		return
	}
	if nf, ok := f["name"]; ok {
		p.name, _ = p.str(nf.val, "name")
	}
	df := f["domain"]
	// The domain is recorded even when its descriptors turn out to be
	// invalid, so that a duplicate of it in a later file is still reported.
	p.domain, p.domainLine = domain, df.key.Line
	if items, ok := p.sequenceOf(f, "descriptors", "descriptors"); ok {
		p.root = p.descriptors(items, nil, nil)
	}
	if p.root == nil {
		p.root = level{} // a known domain without descriptors matches nothing
	}
}

// unmarshal parses data into doc, turning a panic inside the YAML library
// into an error: the config is operator input and must never crash Sluice.
func unmarshal(data []byte, doc *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: %v", r)
		}
	}()
	return yaml.Unmarshal(data, doc)
}

// yamlError records a syntax error, moving the library's "yaml: line N:"
// prefix into the Error's line.
func (p *fileParser) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, convErr := strconv.Atoi(num); convErr == nil {
				line, msg = n, tail
			}
		}
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Msg: "invalid YAML: " + msg, Err: err})
}

// descriptors parses one list of sibling nodes, children of parent (nil at
// the top), whose ancestors have the keys pathKeys.
func (p *fileParser) descriptors(items []*yaml.Node, parent *Rule, pathKeys []string) level {
	if len(items) == 0 {
		return nil
	}
	if len(pathKeys) >= maxDepth {
		p.errorf(items[0].Line, "descriptors nested more than %d levels deep", maxDepth)
		return nil
	}
	lvl := make(level)
	for _, it := range p.mappings(items, "descriptor") {
		p.node(it, parent, pathKeys, lvl)
	}
	return lvl
}

// node parses one descriptor node (a mapping) and adds it to lvl.
func (p *fileParser) node(n *yaml.Node, parent *Rule, parentKeys []string, lvl level) {
	f := p.fields(n, "descriptor",
		// envoyproxy/ratelimit's keys, then Sluice's.
		"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "share_threshold",
		"quota_mode", "value_to_metric", "metadata",
		"limits", "entity", "resource", "parent", "global", "charges")
	key, ok := p.requiredString(n, f, "key", "descriptor")
	if !ok {
		return
	}
	kf := f["key"]
	r := &Rule{Domain: p.domain, File: p.file, Line: n.Line, key: key, up: parent}
	if vf, ok := f["value"]; ok {
		r.value, _ = p.str(vf.val, "value")
	}
	switch {
	case r.value == "":
		r.kind = kindBare // as in envoyproxy/ratelimit, an empty value is no value
	case strings.Contains(r.value, "*"):
		r.kind, r.pattern = kindWildcard, compilePattern(r.value)
	default:
		r.kind = kindExact
	}

	parentPath := p.domain
	if parent != nil {
		parentPath, r.entityLevels = parent.Path, parent.entityLevels
	}
	r.Path = parentPath + "/" + key
	if r.kind != kindBare {
		r.Path += "=" + r.value
	}

	r.ShadowMode = p.boolField(f, "shadow_mode")
	r.QuotaMode = p.boolField(f, "quota_mode")
	r.Global = p.boolField(f, "global")
	if cf, ok := f["charges"]; ok {
		if v, ok := p.str(cf.val, "charges"); ok {
			if r.Charges, ok = parseCharges(v); !ok {
				p.errorf(cf.val.Line, "charges: want own_hits, always or never, got %q", v)
			}
		}
	}
	r.DetailedMetric = p.boolField(f, "detailed_metric")
	r.ValueToMetric = p.boolField(f, "value_to_metric")
	if mf, ok := f["metadata"]; ok && mf.val.ShortTag() != "!!null" && p.isMapping(mf.val, "metadata") {
		if m, ok := p.metadataValue(mf.val, 0); ok {
			r.Metadata = m.(map[string]any)
		}
	}
	r.share = p.boolField(f, "share_threshold")
	if r.share && r.kind != kindWildcard {
		p.errorf(f["share_threshold"].key.Line, "share_threshold is only meaningful on a wildcard value (a value with '*')")
	}
	depth := len(parentKeys)
	if r.kind == kindBare || (r.kind == kindWildcard && !r.share) {
		// Clip so that siblings never append into each other's array.
		r.entityLevels = append(slices.Clip(r.entityLevels), depth)
	}

	p.rateLimit(r, f)
	p.limits(r, f)

	pathKeys := append(slices.Clip(parentKeys), key)
	r.entity = p.templateField(f, "entity", pathKeys)
	r.resource = p.templateField(f, "resource", pathKeys)
	r.parent = p.templateField(f, "parent", pathKeys)

	if p.add(lvl, r, kf.key.Line) {
		p.claimPath(r, kf.key.Line)
	}
	p.rules = append(p.rules, r) // before the children: Rules() is in file order
	if items, ok := p.sequenceOf(f, "descriptors", "descriptors"); ok {
		r.children = p.descriptors(items, r, pathKeys)
	}
}

// add puts r into its level, refusing a second node with the same key and
// value (or a second bare node of the key); it reports whether r went in.
func (p *fileParser) add(lvl level, r *Rule, line int) bool {
	k := lvl[r.key]
	if k == nil {
		k = &keyNodes{}
		lvl[r.key] = k
	}
	if r.kind == kindBare {
		if k.bare != nil {
			p.errorf(line, "duplicate descriptor: key %q without a value is already at line %d", r.key, k.bare.Line)
			return false
		}
		k.bare = r
		return true
	}
	if prev := k.exact[r.value]; prev != nil {
		p.errorf(line, "duplicate descriptor: key %q with value %q is already at line %d", r.key, r.value, prev.Line)
		return false
	}
	if k.exact == nil {
		k.exact = make(map[string]*Rule)
	}
	k.exact[r.value] = r
	if r.kind == kindWildcard {
		k.wildcards = append(k.wildcards, r)
	}
	return true
}

// claimPath refuses a node whose path another node of the file already
// has. Keys and values may hold '=' and '/', so two different nodes can
// spell one path (key "a=b" with value "c", and key "a" with value
// "b=c"). The path is the rule's name in metrics and its default
// resource: two exact-value rules would share buckets.
func (p *fileParser) claimPath(r *Rule, line int) {
	if prev, ok := p.paths[r.Path]; ok {
		p.errorf(line, "descriptor path %q is already the path of the descriptor at line %d (an '=' or '/' in a key or value): "+
			"the two would share one name in metrics and one default resource; rename one", r.Path, prev)
		return
	}
	if p.paths == nil {
		p.paths = make(map[string]int)
	}
	p.paths[r.Path] = line
}

func (p *fileParser) templateField(f map[string]field, name string, pathKeys []string) *template {
	fl, ok := f[name]
	if !ok {
		return nil
	}
	text, ok := p.str(fl.val, name)
	if !ok {
		return nil
	}
	t, err := parseTemplate(text, pathKeys)
	if err != nil {
		p.errorf(fl.val.Line, "%s: %v", name, err)
		return nil
	}
	return t
}
