// Package usage adds up what a replica is asked for each global key in
// each sync window (regions.Slot), so that its region's sync can move
// shares toward demand: every decision of a global key adds what it
// asked of the limit (regions.Asked), admitted or not, and once a slot is
// over the replica writes its sums into its region's store, where the
// syncs of every region read them.
//
// A replica that dies loses the slot it was counting; its region's
// demand then reads low for one window, which the next window mends.
package usage

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"sync"

	"github.com/sluice-rl/sluice/regions"
)

// Counter is one replica's sums, safe for concurrent use. Its memory is
// bounded: past MaxKeys keys in one slot, new keys are not counted (and
// Dropped says how many requests were not). Build one with New.
type Counter struct {
	mu      sync.Mutex
	max     int
	slots   map[regions.Slot]map[regions.Key]float64
	dropped int64
}

// New is a Counter of at most maxKeys keys a slot.
func New(maxKeys int) *Counter {
	return &Counter{max: max(maxKeys, 1), slots: map[regions.Slot]map[regions.Key]float64{}}
}

// Add counts parts asked of k in slot m.
func (c *Counter) Add(k regions.Key, m regions.Slot, parts float64) {
	if !(parts > 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[m]
	if s == nil {
		s = map[regions.Key]float64{}
		c.slots[m] = s
	}
	if _, ok := s[k]; !ok && len(s) >= c.max {
		c.dropped++
		return
	}
	s[k] += parts
}

// Slot is one slot's sums, each rounded up to whole parts.
type Slot struct {
	Slot   regions.Slot
	Counts map[regions.Key]int64
}

// Take removes and returns the sums of every slot before m, oldest
// first: the slots that are over once m has begun.
func (c *Counter) Take(m regions.Slot) []Slot {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Slot
	for s, sums := range c.slots {
		if s >= m {
			continue
		}
		counts := make(map[regions.Key]int64, len(sums))
		for k, p := range sums {
			counts[k] = int64(math.Ceil(min(p, math.MaxInt64/2)))
		}
		out = append(out, Slot{Slot: s, Counts: counts})
		delete(c.slots, s)
	}
	slices.SortFunc(out, func(a, b Slot) int { return cmp.Compare(a.Slot, b.Slot) })
	return out
}

// Dropped is how many requests went uncounted because their slot already
// held MaxKeys keys.
func (c *Counter) Dropped() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// Encode writes counts as JSON chunks of at most maxBytes each (a key too
// long for one is left out: no store holds a key that long), for stores
// that keep a replica's sums of a slot as a few items rather than an item
// a key.
func Encode(counts map[regions.Key]int64, maxBytes int) [][]byte {
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b regions.Key) int {
		return cmp.Or(cmp.Compare(a.Entity, b.Entity), cmp.Compare(a.Resource, b.Resource))
	})
	var out [][]byte
	chunk := []byte{'['}
	for _, k := range keys {
		e, _ := json.Marshal([]any{k.Entity, k.Resource, counts[k]})
		if len(e)+2 > maxBytes {
			continue
		}
		if len(chunk)+len(e)+1 > maxBytes {
			out = append(out, append(chunk[:len(chunk)-1], ']'))
			chunk = []byte{'['}
		}
		chunk = append(append(chunk, e...), ',')
	}
	if len(chunk) > 1 {
		out = append(out, append(chunk[:len(chunk)-1], ']'))
	}
	return out
}

// Decode adds a chunk Encode wrote into counts. A chunk that is not one
// is an error, and adds nothing.
func Decode(b []byte, counts map[regions.Key]int64) error {
	type row struct {
		Entity, Resource string
		Parts            int64
	}
	var rows []row
	var raw [][3]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	for i, r := range raw {
		var x row
		if json.Unmarshal(r[0], &x.Entity) != nil || json.Unmarshal(r[1], &x.Resource) != nil || json.Unmarshal(r[2], &x.Parts) != nil ||
			x.Entity == "" || x.Resource == "" || x.Parts < 0 {
			return fmt.Errorf("usage: row %d is not [entity, resource, parts]", i)
		}
		rows = append(rows, x)
	}
	for _, r := range rows {
		k := regions.Key{Entity: r.Entity, Resource: r.Resource}
		counts[k] = min(counts[k]+min(r.Parts, math.MaxInt64/2), math.MaxInt64/2)
	}
	return nil
}

// Shards is how many parts a region's usage of one slot is spread over
// (DynamoDB partitions, Redis hashes): a large fleet's writes at the
// start of a window do not all land on one, and a sync reads a slot with
// Shards reads.
const Shards = 16

// Replica names one replica's usage entries, and the shard they go to.
type Replica struct {
	ID    string
	Shard int
}

// NewReplica is a random Replica, so that replicas started from one
// image never write over each other's sums.
func NewReplica() (Replica, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Replica{}, fmt.Errorf("naming the replica's usage: %w", err)
	}
	h := fnv.New32a()
	h.Write(b[:])
	return Replica{ID: hex.EncodeToString(b[:]), Shard: int(h.Sum32() % Shards)}, nil
}
