package descriptors

import (
	"slices"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// MatchBucketID maps the BucketId of Envoy's quota filter (RLQS, DESIGN
// section 15), an unordered map of keys to values, onto the rule tree of
// domain as if it were a descriptor: the tree gives the order. At each
// level the id's keys that the level names are tried in key order, the
// first one whose value selects a node (exact, wildcard or bare, as for a
// descriptor) goes next, and the walk succeeds when it ends at a node
// having used every key of the id. So the id {tenant: acme, api: search}
// meets a file whose top level is keyed "api" with a child keyed "tenant"
// as the descriptor (api=search, tenant=acme) would, and charges the same
// bucket.
//
// It returns the match and the descriptor entries in the order the walk
// took them, and false when the domain is unknown, the id is empty, or no
// path of the tree uses exactly its keys. Limit overrides have no
// counterpart in a BucketId.
func (c *Config) MatchBucketID(domain string, id map[string]string) (Match, []*rlv3.RateLimitDescriptor_Entry, bool) {
	lvl, ok := c.domains[domain]
	if !ok || len(id) == 0 {
		return Match{}, nil, false
	}
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w := idWalk{id: id, keys: keys, used: make([]bool, len(keys))}
	n := w.walk(lvl)
	if n == nil {
		return Match{}, nil, false
	}
	return n.identify(w.entries), w.entries, true
}

// idWalk is one MatchBucketID in progress: the id, its keys sorted, which
// of them the path so far has used, and the entries it formed.
type idWalk struct {
	id      map[string]string
	keys    []string
	used    []bool
	entries []*rlv3.RateLimitDescriptor_Entry
}

// walk extends the path at lvl and returns the node it ends at, nil when
// no extension uses every key. It backtracks: two keys may both be named
// at one level, and only one of them may lead on. A path is at most one
// node per key, so the search is bounded by the id's size and the tree's
// fan-out in its keys.
func (w *idWalk) walk(lvl level) *Rule {
	for i, k := range w.keys {
		if w.used[i] {
			continue
		}
		n := lvl.lookup(k, w.id[k])
		if n == nil {
			continue
		}
		w.used[i] = true
		w.entries = append(w.entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: w.id[k]})
		if len(w.entries) == len(w.keys) {
			return n
		}
		if r := w.walk(n.children); r != nil {
			return r
		}
		w.used[i] = false
		w.entries = w.entries[:len(w.entries)-1]
	}
	return nil
}
