package backend

import "fmt"

// RecordKey names one operator record, the unit an operator writes and
// deletes: the system default (both fields empty, the zero value), a
// resource default (Resource only), or an entity's config for a resource
// (Entity and Resource; Resource is DefaultResource for the entity-wide
// config).
type RecordKey struct {
	Entity   string
	Resource string
}

// SystemKey is the key of the system default.
func SystemKey() RecordKey { return RecordKey{} }

// ResourceKey is the key of resource's default.
func ResourceKey(resource string) RecordKey { return RecordKey{Resource: resource} }

// EntityKey is the key of entity's config for resource.
func EntityKey(entity, resource string) RecordKey {
	return RecordKey{Entity: entity, Resource: resource}
}

// Level is the level the record stands at in resolution.
func (k RecordKey) Level() Level {
	switch {
	case k.Entity != "" && k.Resource == DefaultResource:
		return LevelEntityDefault
	case k.Entity != "":
		return LevelEntity
	case k.Resource != "":
		return LevelResource
	}
	return LevelSystem
}

// Valid reports whether k names a record: an entity's config needs its
// resource.
func (k RecordKey) Valid() error {
	if k.Entity != "" && k.Resource == "" {
		return fmt.Errorf("entity %q: a config needs a resource (%s for the entity-wide one)", k.Entity, DefaultResource)
	}
	return nil
}

func (k RecordKey) String() string {
	switch k.Level() {
	case LevelEntity, LevelEntityDefault:
		return fmt.Sprintf("entity %q resource %q", k.Entity, k.Resource)
	case LevelResource:
		return fmt.Sprintf("resource %q", k.Resource)
	}
	return "system"
}
