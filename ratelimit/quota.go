package ratelimit

import (
	"strconv"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// quotaTally decides a request's overall code from its descriptors'
// codes, as envoyproxy/ratelimit does since quota mode (quota_mode on a
// rule, or QUOTA_MODE for all): a descriptor in quota mode that is over
// its limit does not fail the request by itself. The request is over its
// limit when some descriptor not in quota mode is, or when every
// descriptor in quota mode is (a caller whose every quota is spent has
// nowhere left to go; while one quota has room, it passes, and the
// descriptors' own codes tell which are spent). Unlimited descriptors
// count as neither, and so do those no limit decided (unmatched,
// replaced, at a node without limits) unless every descriptor is in
// quota mode. Each descriptor keeps its own code.
//
// With group keys (Options.QuotaGroupKeys), quota descriptors that carry
// the same values of those keys are one quota: it is spent when any of
// them is over, and the request is over when every quota is spent. That
// is what a caller needs whose several buckets guard one place, as Envoy
// AI Gateway sends a tenant's bucket and the model's default bucket for
// one backend and model: a spent tenant bucket must close that backend to
// the tenant even while the default bucket has room. A quota descriptor
// that carries none of the keys is a quota of its own, so without keys
// every one is, which is envoyproxy/ratelimit's rule.
type quotaTally struct {
	groupKeys []string
	// keepPassed keeps what the passed list needs. Without dynamic
	// metadata nobody reads it, and it would cost every call an
	// allocation.
	keepPassed bool

	overNormal int
	// seen holds, in request order, every quota descriptor and (when
	// keepPassed) every other limited descriptor that passed.
	seen []tallied
	// groups counts the quotas; names numbers those named by group key
	// values.
	groups int
	names  map[string]int
}

type tallied struct {
	i       int
	group   int // the quota it belongs to; -1 for a descriptor not in quota mode
	over    bool
	limited bool
}

// count records descriptor i (d), over its limit or not, in quota mode or
// not, decided by a limit or not.
func (q *quotaTally) count(i int, d *rlv3.RateLimitDescriptor, over, quota, limited bool) {
	switch {
	case quota:
		q.seen = append(q.seen, tallied{i: i, group: q.group(d), over: over, limited: limited})
	case over:
		q.overNormal++
	case q.keepPassed && limited:
		q.seen = append(q.seen, tallied{i: i, group: -1, limited: true})
	}
}

// group numbers the quota d belongs to.
func (q *quotaTally) group(d *rlv3.RateLimitDescriptor) int {
	if len(q.groupKeys) > 0 {
		var name strings.Builder
		found := false
		for _, k := range q.groupKeys {
			v, ok := entryValue(d, k)
			if !ok {
				name.WriteString("-")
				continue
			}
			// Length-prefixed: values are request data, and no value
			// may make two different groups spell one name.
			found = true
			name.WriteString(strconv.Itoa(len(v)))
			name.WriteString(":")
			name.WriteString(v)
		}
		if found {
			if q.names == nil {
				q.names = make(map[string]int)
			}
			if g, ok := q.names[name.String()]; ok {
				return g
			}
			q.names[name.String()] = q.groups
		}
	}
	q.groups++
	return q.groups - 1
}

// entryValue is the value of d's first entry with key k.
func entryValue(d *rlv3.RateLimitDescriptor, k string) (string, bool) {
	for _, e := range d.GetEntries() {
		if e.GetKey() == k {
			return e.GetValue(), true
		}
	}
	return "", false
}

// result reports whether the request is over its limit and, when
// keepPassed, the descriptors whose rules' metadata the response's
// dynamic metadata carries, in request order: the limited ones that
// passed, less those of a spent quota (a passing bucket of a backend
// whose other bucket is spent does not make that backend available).
func (q *quotaTally) result() (over bool, passed []int) {
	var spent []bool
	if q.groups > 0 {
		spent = make([]bool, q.groups)
		for _, t := range q.seen {
			if t.group >= 0 && t.over {
				spent[t.group] = true
			}
		}
	}
	over = q.overNormal > 0
	if q.groups > 0 && !over {
		over = true
		for _, s := range spent {
			over = over && s
		}
	}
	if !q.keepPassed {
		return over, nil
	}
	for _, t := range q.seen {
		if t.limited && !t.over && (t.group < 0 || !spent[t.group]) {
			passed = append(passed, t.i)
		}
	}
	return over, passed
}
