package descriptors

import (
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// field is one entry of a YAML mapping: the key node (for the line of
// errors about the entry as a whole) and its value, aliases resolved.
type field struct{ key, val *yaml.Node }

// fields returns the entries of mapping n by key. A key that is not in
// allowed, or that appears twice, is an error: a typo such as "requests_per_uint"
// must not silently leave a descriptor unlimited.
func (p *fileParser) fields(n *yaml.Node, where string, allowed ...string) map[string]field {
	f := make(map[string]field, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		if p.spend() {
			break
		}
		k, v := p.deref(n.Content[i]), p.deref(n.Content[i+1])
		if k == nil || v == nil {
			break
		}
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "in %s: a key must be a string, got %s", where, kindName(k))
			continue
		}
		if prev, dup := f[k.Value]; dup {
			p.errorf(k.Line, "in %s: key %q is already set at line %d", where, k.Value, prev.key.Line)
			continue
		}
		if !slices.Contains(allowed, k.Value) {
			p.errorf(k.Line, "unknown key %q in %s (want one of: %s)", k.Value, where, strings.Join(allowed, ", "))
			continue
		}
		f[k.Value] = field{key: k, val: v}
	}
	return f
}

// spend counts one unit of work and reports whether the file has used up
// its budget (see maxWork).
func (p *fileParser) spend() bool {
	if p.stop {
		return true
	}
	p.work++
	if p.work > maxWork {
		p.errorf(0, "file too large: more than %d entries (counting YAML alias expansions)", maxWork)
		p.stop = true
	}
	return p.stop
}

// deref follows aliases to the node they name. It returns nil once the
// walk has been abandoned.
func (p *fileParser) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		if p.spend() {
			return nil
		}
		n = n.Alias
	}
	if n == nil || p.stop {
		return nil
	}
	return n
}

// mappings returns the items of a sequence, aliases followed, that are
// mappings; it reports the others and stops where the work budget runs
// out.
func (p *fileParser) mappings(items []*yaml.Node, what string) []*yaml.Node {
	out := make([]*yaml.Node, 0, len(items))
	for _, it := range items {
		if p.spend() {
			break
		}
		if it = p.deref(it); it == nil {
			break
		}
		if p.isMapping(it, what) {
			out = append(out, it)
		}
	}
	return out
}

// requiredString reads the field name of mapping n, which must be present
// and a non-empty string; what names the mapping in the messages.
func (p *fileParser) requiredString(n *yaml.Node, f map[string]field, name, what string) (string, bool) {
	fl, ok := f[name]
	if !ok {
		p.errorf(n.Line, "%s has no %s", what, name)
		return "", false
	}
	v, ok := p.str(fl.val, name)
	if !ok {
		return "", false
	}
	if v == "" {
		p.errorf(fl.key.Line, "%s has an empty %s", what, name)
		return "", false
	}
	return v, true
}

func (p *fileParser) isMapping(n *yaml.Node, what string) bool {
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, "%s: want a mapping, got %s", what, kindName(n))
		return false
	}
	return true
}

// str reads a scalar as text. Any scalar is accepted, as the YAML library of
// envoyproxy/ratelimit does for its string fields: `value: 500` is "500".
// Null is "".
func (p *fileParser) str(n *yaml.Node, name string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n.Line, "%s: want a string, got %s", name, kindName(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// boolField reads an optional boolean entry of f; absent or null is false.
// The YAML 1.1 spellings (yes, on, ...) that envoyproxy/ratelimit accepts
// are accepted too.
func (p *fileParser) boolField(f map[string]field, name string) bool {
	fl, ok := f[name]
	if !ok {
		return false
	}
	var b bool
	if fl.val.Kind != yaml.ScalarNode || fl.val.Decode(&b) != nil {
		p.errorf(fl.val.Line, "%s: want true or false, got %s", name, kindName(fl.val))
		return false
	}
	return b
}

// sequenceOf reads the optional list entry key of f; absent or null is
// empty. name is the entry's name in error messages.
func (p *fileParser) sequenceOf(f map[string]field, key, name string) ([]*yaml.Node, bool) {
	fl, ok := f[key]
	if !ok || (fl.val.Kind == yaml.ScalarNode && fl.val.ShortTag() == "!!null") {
		return nil, true
	}
	if fl.val.Kind != yaml.SequenceNode {
		p.errorf(fl.val.Line, "%s: want a list, got %s", name, kindName(fl.val))
		return nil, false
	}
	return fl.val.Content, true
}

// kindName describes a node for error messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!bool":
			return "a boolean (" + n.Value + ")"
		case "!!int", "!!float":
			return "a number (" + n.Value + ")"
		}
		return "a string (" + quoteShort(n.Value) + ")"
	}
	return "an unexpected YAML node"
}

// quoteShort quotes s for an error message, cut to a readable length.
func quoteShort(s string) string {
	const max = 40
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
