package backend

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// DefaultResource is the resource name of an entity's catch-all config.
const DefaultResource = "_default_"

// Level says where a bucket's limits came from. The first level with a
// non-empty list of limits wins, whole (DESIGN section 3).
type Level int

const (
	// LevelNone: no level has limits; the bucket is not limited.
	LevelNone Level = iota
	// LevelEntity: the entity's config for this resource.
	LevelEntity
	// LevelEntityDefault: the entity's config for resource _default_.
	LevelEntityDefault
	// LevelResource: the resource default (a backend record, else the
	// mapping config's limits).
	LevelResource
	// LevelSystem: the system default.
	LevelSystem
)

func (l Level) String() string {
	switch l {
	case LevelEntity:
		return "entity"
	case LevelEntityDefault:
		return "entity_default"
	case LevelResource:
		return "resource"
	case LevelSystem:
		return "system"
	}
	return "none"
}

// Record is a stored list of limits at one level.
type Record struct {
	Limits []bucket.Limit
	// Synced marks an entity config written by an automated sync (it
	// carries a ttl, ADR-128); its buckets expire like default-sourced ones.
	Synced bool
}

// Records is where a backend keeps the operator's records of levels 1 to
// 4. A missing record is (Record{}, false, nil); err is for a store that
// could not answer, which must never be read as "missing".
type Records interface {
	Entity(ctx context.Context, entity, resource string) (Record, bool, error)
	Resource(ctx context.Context, resource string) (Record, bool, error)
	System(ctx context.Context) (Record, bool, error)
}

// Resolved is the outcome of limit resolution for one bucket.
type Resolved struct {
	Limits []bucket.Limit
	Level  Level
	Synced bool
	// Regional: Limits are this region's part of a global limit
	// (Global), which the regions hold together, not the whole of it.
	// Such a bucket's answers are a share's, never one bucket's, even
	// with one replica in the region, so near the limit its calls are
	// answered from the lease rather than queued for the table
	// (Leases.AtLimit).
	Regional bool
}

// Resolve walks the four levels for (entity, resource): entity config for
// the resource, entity config for _default_, the resource default (a
// record beats the mapping config's defaults), the system default.
func Resolve(ctx context.Context, rec Records, entity, resource string, defaults []bucket.Limit) (Resolved, error) {
	if r, ok, err := rec.Entity(ctx, entity, resource); err != nil {
		return Resolved{}, fmt.Errorf("entity config %q/%q: %w", entity, resource, err)
	} else if ok && len(r.Limits) > 0 {
		return Resolved{Limits: r.Limits, Level: LevelEntity, Synced: r.Synced}, nil
	}
	if r, ok, err := rec.Entity(ctx, entity, DefaultResource); err != nil {
		return Resolved{}, fmt.Errorf("entity default config %q: %w", entity, err)
	} else if ok && len(r.Limits) > 0 {
		return Resolved{Limits: r.Limits, Level: LevelEntityDefault, Synced: r.Synced}, nil
	}
	if r, ok, err := rec.Resource(ctx, resource); err != nil {
		return Resolved{}, fmt.Errorf("resource config %q: %w", resource, err)
	} else if ok && len(r.Limits) > 0 {
		return Resolved{Limits: r.Limits, Level: LevelResource}, nil
	}
	if len(defaults) > 0 {
		return Resolved{Limits: defaults, Level: LevelResource}, nil
	}
	if r, ok, err := rec.System(ctx); err != nil {
		return Resolved{}, fmt.Errorf("system config: %w", err)
	} else if ok && len(r.Limits) > 0 {
		return Resolved{Limits: r.Limits, Level: LevelSystem}, nil
	}
	return Resolved{}, nil
}
