package descriptors

import (
	"math"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// metadataValue converts the YAML under a node's `metadata` key into the
// plain values a google.protobuf.Struct holds: map[string]any for a
// mapping, []any for a list, and for a scalar a float64 (a number), a bool,
// nil or a string. Aliases are followed within the file's work budget. It
// reports false, after recording the error, for what a Struct cannot
// hold: a mapping key that is not a string, or a number out of range.
func (p *fileParser) metadataValue(n *yaml.Node, depth int) (any, bool) {
	if n = p.deref(n); n == nil {
		return nil, false
	}
	if depth > maxDepth {
		p.errorf(n.Line, "metadata nested more than %d levels deep", maxDepth)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			if p.spend() {
				return nil, false
			}
			k := p.deref(n.Content[i])
			if k == nil {
				return nil, false
			}
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
				p.errorf(k.Line, "metadata: a key must be a string, got %s", kindName(k))
				return nil, false
			}
			if _, dup := m[k.Value]; dup {
				p.errorf(k.Line, "metadata: key %q is set twice", k.Value)
				return nil, false
			}
			v, ok := p.metadataValue(n.Content[i+1], depth+1)
			if !ok {
				return nil, false
			}
			m[k.Value] = v
		}
		return m, true
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, it := range n.Content {
			if p.spend() {
				return nil, false
			}
			v, ok := p.metadataValue(it, depth+1)
			if !ok {
				return nil, false
			}
			l = append(l, v)
		}
		return l, true
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, true
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b, true
			}
		case "!!int", "!!float":
			// The YAML library reads a number too large for a float64 as
			// a string; .inf and .nan are the only others a Struct (JSON)
			// cannot carry.
			var f float64
			if err := n.Decode(&f); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				return f, true
			}
			p.errorf(n.Line, "metadata: %s is not a number a Struct can hold", strconv.Quote(n.Value))
			return nil, false
		}
		return n.Value, true
	}
	p.errorf(n.Line, "metadata: unexpected %s", kindName(n))
	return nil, false
}
