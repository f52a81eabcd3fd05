// Package manifest reads declarative limits manifests, the files of
// `sluice limits apply`, and plans the changes that bring the stored
// records in line with one. It does no I/O beyond its input bytes: the
// caller reads the table and executes the plan.
//
// A manifest names records at the three levels an operator writes:
//
//	system:
//	  - {name: rpm, rate: 1000/min}
//	resources:
//	  chat:
//	    - {name: rpm, rate: 20/min, cost: request}
//	    - {name: tpm, rate: 40000/min, burst: 60000}
//	entities:
//	  acme:
//	    _default_:
//	      - {name: rpm, rate: 500/min}
//
// Each list replaces the record's limits whole, as resolution uses them.
package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// Manifest is a parsed manifest: the records it declares, in a stable
// order (system, then resources, then entities, each by name).
type Manifest struct {
	Records []Record
}

// Record is one declared record and its limits.
type Record struct {
	Key    backend.RecordKey
	Limits []bucket.Limit
}

// Parse reads a manifest. name prefixes error messages, which give the
// line of each problem; all problems are reported together.
func Parse(name string, data []byte) (*Manifest, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return &Manifest{}, nil
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s:%d: a manifest is one YAML document", name, extra.Line)
	}
	p := &parser{name: name}
	m := &Manifest{}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		if doc.Tag == "!!null" {
			return m, nil
		}
		return nil, fmt.Errorf("%s:%d: want a mapping with system, resources and entities", name, doc.Line)
	}
	for i := 0; i < len(doc.Content); i += 2 {
		k, v := doc.Content[i], doc.Content[i+1]
		switch k.Value {
		case "system":
			if limits, ok := p.limits(v, "system"); ok {
				m.Records = append(m.Records, Record{backend.SystemKey(), limits})
			}
		case "resources":
			p.each(v, "resources", func(rk, rv *yaml.Node) {
				if limits, ok := p.limits(rv, "resource "+rk.Value); ok {
					m.Records = append(m.Records, Record{backend.ResourceKey(rk.Value), limits})
				}
			})
		case "entities":
			p.each(v, "entities", func(ek, ev *yaml.Node) {
				p.each(ev, "entity "+ek.Value, func(rk, rv *yaml.Node) {
					if limits, ok := p.limits(rv, fmt.Sprintf("entity %s resource %s", ek.Value, rk.Value)); ok {
						m.Records = append(m.Records, Record{backend.EntityKey(ek.Value, rk.Value), limits})
					}
				})
			})
		default:
			p.errorf(k, "unknown key %q (want system, resources or entities)", k.Value)
		}
	}
	if len(p.errs) > 0 {
		return nil, errors.New(strings.Join(p.errs, "\n"))
	}
	slices.SortStableFunc(m.Records, func(a, b Record) int { return CompareKeys(a.Key, b.Key) })
	return m, nil
}

// CompareKeys orders records from the top of resolution: system,
// resources, entities; then by name.
func CompareKeys(a, b backend.RecordKey) int {
	rank := func(k backend.RecordKey) int {
		switch k.Level() {
		case backend.LevelSystem:
			return 0
		case backend.LevelResource:
			return 1
		}
		return 2
	}
	if c := rank(a) - rank(b); c != 0 {
		return c
	}
	if c := strings.Compare(a.Entity, b.Entity); c != 0 {
		return c
	}
	return strings.Compare(a.Resource, b.Resource)
}

type parser struct {
	name string
	errs []string
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.errs = append(p.errs, fmt.Sprintf("%s:%d: %s", p.name, n.Line, fmt.Sprintf(format, args...)))
}

// each walks a mapping of names, refusing empty and repeated ones.
func (p *parser) each(n *yaml.Node, what string, fn func(k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s: want a mapping of names", what)
		return
	}
	seen := map[string]bool{}
	for i := 0; i < len(n.Content); i += 2 {
		k := n.Content[i]
		switch {
		case k.Kind != yaml.ScalarNode || k.Value == "":
			p.errorf(k, "%s: want a non-empty name", what)
		case seen[k.Value]:
			p.errorf(k, "%s: %q given twice", what, k.Value)
		default:
			seen[k.Value] = true
			fn(k, n.Content[i+1])
		}
	}
}

// limits reads a list of limits {name, rate, burst, cost}.
func (p *parser) limits(n *yaml.Node, what string) ([]bucket.Limit, bool) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		p.errorf(n, "%s: want a list of limits, e.g. [{name: rpm, rate: 100/min}]", what)
		return nil, false
	}
	before := len(p.errs)
	var out []bucket.Limit
	names := map[string]bool{}
	for _, item := range n.Content {
		if item.Kind != yaml.MappingNode {
			p.errorf(item, "%s: want a limit {name, rate, burst, cost}", what)
			continue
		}
		for i := 0; i < len(item.Content); i += 2 {
			switch k := item.Content[i]; k.Value {
			case "name", "rate", "burst", "cost":
			default:
				p.errorf(k, "%s: unknown key %q in a limit (want name, rate, burst or cost)", what, k.Value)
			}
		}
		var spec bucket.Spec
		if err := item.Decode(&spec); err != nil {
			p.errorf(item, "%s: %v", what, err)
			continue
		}
		l, err := spec.Limit()
		if err != nil {
			p.errorf(item, "%s: %v", what, err)
			continue
		}
		if names[l.Name] {
			p.errorf(item, "%s: limit %q given twice", what, l.Name)
			continue
		}
		names[l.Name] = true
		out = append(out, l)
	}
	return out, len(p.errs) == before
}
