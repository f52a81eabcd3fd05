package memory

import (
	"cmp"
	"slices"
	"sync"

	"github.com/sluice-rl/sluice/backend/bucket"
)

type key struct{ entity, resource string }

// shard is one slice of the bucket map. Its mutex guards the map only;
// each entry has its own. Lock order: shard, then entry (eviction), and a
// decision never takes a shard lock while holding an entry lock.
type shard struct {
	mu      sync.Mutex
	buckets map[key]*entry
	max     int
}

// entry is one bucket: all the limits of one entity and resource. Every
// field is guarded by mu.
type entry struct {
	mu     sync.Mutex
	limits []bucket.Limit
	states []bucket.State // nil until the first decision
	// expires is when the bucket counts as absent (epoch ms); 0 is never.
	expires int64
	// used is the time of the last decision, for least-recently-used
	// eviction.
	used int64
	// dead marks an entry removed from its shard; a decision that locked
	// it must look the bucket up again.
	dead bool
}

// get returns the entry for k, creating it (and making room) if needed.
func (s *shard) get(k key, now int64) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.buckets[k]; ok {
		return e
	}
	if len(s.buckets) >= s.max {
		s.evict(now)
	}
	e := &entry{used: now}
	s.buckets[k] = e
	return e
}

// evict brings a full shard down to 90% of its cap: first buckets that
// are expired or refilled (dropping them changes no decision), then the
// least recently used. Entries busy in a decision are skipped.
func (s *shard) evict(now int64) {
	target := s.max - max(1, s.max/10)
	for k, e := range s.buckets {
		if len(s.buckets) <= target {
			return
		}
		s.dropIfIdle(k, e, now)
	}
	type aged struct {
		k    key
		used int64
	}
	var victims []aged
	for k, e := range s.buckets {
		if e.mu.TryLock() {
			victims = append(victims, aged{k, e.used})
			e.mu.Unlock()
		}
	}
	slices.SortFunc(victims, func(a, b aged) int { return cmp.Compare(a.used, b.used) })
	for _, v := range victims {
		if len(s.buckets) <= target {
			return
		}
		e := s.buckets[v.k]
		if e.mu.TryLock() {
			s.remove(v.k, e)
			e.mu.Unlock()
		}
	}
}

// dropIfIdle removes e if it has expired or is full. s.mu must be held.
func (s *shard) dropIfIdle(k key, e *entry, now int64) {
	if !e.mu.TryLock() {
		return
	}
	defer e.mu.Unlock()
	if e.states == nil || e.expired(now) || e.full(now) {
		s.remove(k, e)
	}
}

// remove deletes e from the shard. Both s.mu and e.mu must be held.
func (s *shard) remove(k key, e *entry) {
	e.dead = true
	delete(s.buckets, k)
}

func (e *entry) expired(now int64) bool { return e.expires != 0 && now >= e.expires }

func (e *entry) full(now int64) bool {
	for i, l := range e.limits {
		if bucket.Refill(l, e.states[i], now).Tokens < l.Burst {
			return false
		}
	}
	return true
}

// prepare brings the entry to the resolved limits at now: an absent or
// expired bucket starts full; a bucket built from other limits is
// reconciled to the new ones (DESIGN section 6, pitfalls 3 and 4).
func (e *entry) prepare(limits []bucket.Limit, now int64) {
	switch {
	case e.states == nil || e.expired(now):
		e.states = make([]bucket.State, len(limits))
		for i, l := range limits {
			e.states[i] = bucket.Full(l, now)
		}
		e.expires = 0
	case !slices.Equal(e.limits, limits):
		e.states = bucket.Reconcile(e.limits, e.states, limits, now)
	}
	e.limits = limits
}
