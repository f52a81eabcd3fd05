package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// Overrides are the operator's limit records for the memory backend,
// levels 1 to 4 of DESIGN section 3, read from one YAML file:
//
//	system:
//	  limits: [{name: rps, rate: 1000/s}]
//	resources:
//	  "api/path=/v1/chat":
//	    limits: [{name: rpm, rate: 600/min}]
//	entities:
//	  acme:
//	    _default_:
//	      limits: [{name: rpm, rate: 6000/min}]
//	    "api/path=/v1/chat":
//	      limits: [{name: rpm, rate: 100/min, burst: 150}]
//
// The zero Overrides has no records. Overrides are immutable once built.
type Overrides struct {
	system    backend.Record
	hasSystem bool
	resources map[string]backend.Record
	entities  map[string]map[string]backend.Record
}

type overridesFile struct {
	System    *limitsBlock                      `yaml:"system"`
	Resources map[string]limitsBlock            `yaml:"resources"`
	Entities  map[string]map[string]limitsBlock `yaml:"entities"`
}

type limitsBlock struct {
	Limits []bucket.Spec `yaml:"limits"`
}

// LoadOverrides reads an overrides file. Unknown keys and bad limits are
// errors that name the file (and, for YAML errors, the line).
func LoadOverrides(path string) (*Overrides, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("overrides: %w", err)
	}
	o, err := ParseOverrides(data)
	if err != nil {
		return nil, fmt.Errorf("overrides %s: %w", path, err)
	}
	return o, nil
}

// ParseOverrides builds Overrides from the YAML of an overrides file.
func ParseOverrides(data []byte) (*Overrides, error) {
	var f overridesFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	o := &Overrides{
		resources: make(map[string]backend.Record),
		entities:  make(map[string]map[string]backend.Record),
	}
	var err error
	if f.System != nil {
		if o.system, err = record(f.System.Limits); err != nil {
			return nil, fmt.Errorf("system: %w", err)
		}
		o.hasSystem = true
	}
	for res, blk := range f.Resources {
		if res == "" {
			return nil, errors.New("resources: empty resource name")
		}
		if o.resources[res], err = record(blk.Limits); err != nil {
			return nil, fmt.Errorf("resource %q: %w", res, err)
		}
	}
	for ent, byRes := range f.Entities {
		if ent == "" {
			return nil, errors.New("entities: empty entity name")
		}
		o.entities[ent] = make(map[string]backend.Record, len(byRes))
		for res, blk := range byRes {
			if res == "" {
				return nil, fmt.Errorf("entity %q: empty resource name", ent)
			}
			if o.entities[ent][res], err = record(blk.Limits); err != nil {
				return nil, fmt.Errorf("entity %q resource %q: %w", ent, res, err)
			}
		}
	}
	return o, nil
}

func record(specs []bucket.Spec) (backend.Record, error) {
	r := backend.Record{Limits: make([]bucket.Limit, 0, len(specs))}
	seen := make(map[string]bool, len(specs))
	for _, s := range specs {
		l, err := s.Limit()
		if err != nil {
			return backend.Record{}, err
		}
		if seen[l.Name] {
			return backend.Record{}, fmt.Errorf("limit %q appears twice", l.Name)
		}
		seen[l.Name] = true
		r.Limits = append(r.Limits, l)
	}
	return r, nil
}

// Entity implements backend.Records.
func (o *Overrides) Entity(_ context.Context, entity, resource string) (backend.Record, bool, error) {
	if o == nil {
		return backend.Record{}, false, nil
	}
	r, ok := o.entities[entity][resource]
	return r, ok, nil
}

// Resource implements backend.Records.
func (o *Overrides) Resource(_ context.Context, resource string) (backend.Record, bool, error) {
	if o == nil {
		return backend.Record{}, false, nil
	}
	r, ok := o.resources[resource]
	return r, ok, nil
}

// System implements backend.Records.
func (o *Overrides) System(context.Context) (backend.Record, bool, error) {
	if o == nil {
		return backend.Record{}, false, nil
	}
	return o.system, o.hasSystem, nil
}
