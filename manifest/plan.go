package manifest

import (
	"slices"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// Action is what a plan does to one record.
type Action int

const (
	// Unchanged: the record already holds the declared limits.
	Unchanged Action = iota
	// Create: the record does not exist.
	Create
	// Update: the record exists with other limits, or as a sync-written
	// config whose ttl would let it lapse.
	Update
	// Delete: an earlier apply's manifest listed the record, and this
	// one no longer declares it.
	Delete
)

func (a Action) String() string {
	return [...]string{"unchanged", "create", "update", "delete"}[a]
}

// Current is a record as the table holds it now.
type Current struct {
	Limits []bucket.Limit
	// Synced marks a sync-written entity config (it carries a ttl); a
	// manifest writes operator configs, which never expire.
	Synced bool
}

// Change is one step of a plan.
type Change struct {
	Action Action
	Key    backend.RecordKey
	// Old is the record's limits now (nil for Create); New the limits to
	// write (nil for Delete).
	Old, New []bucket.Limit
}

// Plan lists the changes that make the table hold exactly m's records,
// given current (the table's records for every key of m and of applied)
// and applied (the records the last apply wrote). Records that neither m
// nor applied name are not touched: an apply never deletes what an
// operator or a sync job wrote by hand. The changes come in m's order,
// deletions last.
func Plan(m *Manifest, current map[backend.RecordKey]Current, applied []backend.RecordKey) []Change {
	var out []Change
	declared := map[backend.RecordKey]bool{}
	for _, r := range m.Records {
		declared[r.Key] = true
		cur, ok := current[r.Key]
		switch {
		case !ok:
			out = append(out, Change{Action: Create, Key: r.Key, New: r.Limits})
		case cur.Synced || bucket.Fingerprint(cur.Limits) != bucket.Fingerprint(r.Limits):
			out = append(out, Change{Action: Update, Key: r.Key, Old: cur.Limits, New: r.Limits})
		default:
			out = append(out, Change{Action: Unchanged, Key: r.Key, Old: cur.Limits, New: r.Limits})
		}
	}
	var gone []Change
	for _, k := range applied {
		if declared[k] {
			continue
		}
		declared[k] = true // once, even if listed twice
		if cur, ok := current[k]; ok {
			gone = append(gone, Change{Action: Delete, Key: k, Old: cur.Limits})
		}
	}
	slices.SortFunc(gone, func(a, b Change) int { return CompareKeys(a.Key, b.Key) })
	return append(out, gone...)
}

// Keys lists the records of m, the applied set an apply of m leaves.
func (m *Manifest) Keys() []backend.RecordKey {
	out := make([]backend.RecordKey, len(m.Records))
	for i, r := range m.Records {
		out[i] = r.Key
	}
	return out
}
