package descriptors

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// globalEntity is the default entity of a rule whose every level matched by
// exact value: one bucket for everyone.
const globalEntity = "_global_"

// emptyName stands for an entity, resource or parent that would be empty:
// a request whose only entity value is "" (Envoy sends one for a header
// that is present but empty), or a template that renders nothing.
// envoyproxy/ratelimit counts such a request under the key's rule like any
// other value, so it must get a bucket too; an empty name names none, and
// the request would pass unlimited. No escaped value spells it: joinValues
// writes '%' only as "%25" or "%2F".
const emptyName = "%empty"

// Match is the result of mapping a request descriptor onto the config: the
// rule that applies and the identity of the bucket it charges.
type Match struct {
	Rule     *Rule
	Entity   string
	Resource string
	Parent   string // "" when the rule has no parent template
}

// level is one list of sibling descriptor nodes, indexed by key.
type level map[string]*keyNodes

// keyNodes are the nodes of one level that share a key, arranged in the
// order envoyproxy/ratelimit tries them.
type keyNodes struct {
	// exact holds nodes by their value as written. Wildcard nodes are in it
	// too: envoyproxy/ratelimit looks "key_value" up in one map before it
	// tries wildcards, so a request value equal to a pattern's text selects
	// that pattern's node even when an earlier wildcard also matches.
	exact     map[string]*Rule
	wildcards []*Rule // in file order
	bare      *Rule
}

// lookup returns the node of this level for one request entry: exact value,
// else the first matching wildcard in file order, else the bare key.
func (l level) lookup(key, value string) *Rule {
	k := l[key]
	if k == nil {
		return nil
	}
	if n := k.exact[value]; n != nil {
		return n
	}
	for _, n := range k.wildcards {
		if n.pattern.match(value) {
			return n
		}
	}
	return k.bare
}

// Match maps a request descriptor of domain onto its rule and bucket
// identity. It reports false when the domain is unknown, when an entry
// matches no node, or when the request goes deeper than the config: as in
// envoyproxy/ratelimit a rule applies only to a request whose last entry
// ends at it. A descriptor carrying a limit override (d.Limit) in a known
// domain ignores the config and gets a rule built from the override.
//
// Matching exact and bare nodes allocates nothing; the identity strings
// allocate only when they must join or escape several values.
func (c *Config) Match(domain string, d *rlv3.RateLimitDescriptor) (Match, bool) {
	lvl, ok := c.domains[domain]
	if !ok {
		return Match{}, false
	}
	if d.GetLimit() != nil {
		return overrideMatch(domain, d)
	}
	entries := d.GetEntries()
	for i, e := range entries {
		n := lvl.lookup(e.GetKey(), e.GetValue())
		if n == nil {
			return Match{}, false
		}
		if i == len(entries)-1 {
			return n.identify(entries), true
		}
		lvl = n.children // nil when n has no children: the next lookup fails
	}
	return Match{}, false // no entries
}

// identify builds the bucket identity of a request that ended at r.
func (r *Rule) identify(entries []*rlv3.RateLimitDescriptor_Entry) Match {
	m := Match{Rule: r, Resource: r.Path}
	if r.entity != nil {
		m.Entity = r.entity.render(entries)
	} else {
		m.Entity = joinValues(entries, r.entityLevels)
	}
	if m.Entity == "" {
		m.Entity = emptyName
	}
	if r.resource != nil {
		if m.Resource = r.resource.render(entries); m.Resource == "" {
			m.Resource = emptyName
		}
	}
	if r.parent != nil {
		if m.Parent = r.parent.render(entries); m.Parent == "" {
			m.Parent = emptyName // else an empty value would escape the parent's limit
		}
	}
	return m
}

// joinValues joins the values of the entries at the given indexes with '/',
// escaping '%' and '/' in each value so that different value lists never
// give the same string: ("a/b", "c") is "a%2Fb/c", ("a", "b/c") is "a/b%2Fc".
func joinValues(entries []*rlv3.RateLimitDescriptor_Entry, idx []int) string {
	switch len(idx) {
	case 0:
		return globalEntity
	case 1:
		if v := entries[idx[0]].GetValue(); !strings.ContainsAny(v, "%/") {
			return v
		}
	}
	var b strings.Builder
	for i, j := range idx {
		if i > 0 {
			b.WriteByte('/')
		}
		writeEscaped(&b, entries[j].GetValue())
	}
	return b.String()
}

func writeEscaped(b *strings.Builder, v string) {
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(v[i])
		}
	}
}

// unitLength is the length of a unit of a descriptor's limit override; 0
// for UNKNOWN and for any unit this version does not know.
func unitLength(u typev3.RateLimitUnit) int64 {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return bucket.Second
	case typev3.RateLimitUnit_MINUTE:
		return bucket.Minute
	case typev3.RateLimitUnit_HOUR:
		return bucket.Hour
	case typev3.RateLimitUnit_DAY:
		return bucket.Day
	case typev3.RateLimitUnit_MONTH:
		return bucket.Month
	case typev3.RateLimitUnit_YEAR:
		return bucket.Year
	}
	return 0
}

// overrideMatch builds the rule for a descriptor that carries its own limit
// (Envoy's `limit` override), which envoyproxy/ratelimit applies instead of
// the config. Every entry's value is part of the entity; the resource names
// the keys only, so each distinct value set gets its own bucket.
func overrideMatch(domain string, d *rlv3.RateLimitDescriptor) (Match, bool) {
	o := d.GetLimit()
	period := unitLength(o.GetUnit())
	if period == 0 {
		return Match{}, false
	}
	// Envoy defines the period as unit_multiplier units (1 when unset).
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		if int64(m.GetValue()) > bucket.MaxPeriod/period {
			return Match{}, false
		}
		period *= int64(m.GetValue())
	}
	amount := int64(o.GetRequestsPerUnit()) * bucket.Milli

	entries := d.GetEntries()
	var res strings.Builder
	res.WriteString(domain)
	idx := make([]int, len(entries))
	for i, e := range entries {
		idx[i] = i
		res.WriteByte('/')
		writeEscaped(&res, e.GetKey()) // ("a/b","c") and ("a","b/c") are two key lists
	}
	res.WriteString("/override")

	// The keys are request data: they name the bucket (the resource) but
	// not the rule, whose Path is a label of metrics and logs.
	r := &Rule{
		Domain:           domain,
		Path:             domain + "/override",
		Limits:           []bucket.Limit{{Name: defaultLimitName, Amount: amount, Period: period, Burst: amount}},
		unnamedRateLimit: true,
		override:         true,
	}
	entity := joinValues(entries, idx)
	if entity == "" {
		entity = emptyName
	}
	return Match{Rule: r, Entity: entity, Resource: res.String()}, true
}
