package descriptors

import "github.com/sluice-rl/sluice/backend/bucket"

// defaultLimitName is the name stored for the limit built from an unnamed
// rate_limit block (DESIGN section 6: "The limit name stored for an unnamed
// rate_limit is default").
const defaultLimitName = "default"

// Rule is one descriptor node of the mapping config. Every node is a Rule,
// including nodes that only group children and nodes with no limits (a
// request that ends at such a node matches it and is limited by nothing).
//
// A Rule belongs to an immutable Config: callers must not modify it or the
// slices it holds.
type Rule struct {
	Domain string
	// Path is the default resource: the domain followed by one segment per
	// level, "/key=value" (exact), "/key=pattern" (wildcard) or "/key" (bare),
	// e.g. "test-domain/key1=value1/subkey1".
	Path string
	File string // base name of the file the node came from
	Line int    // line of the node in that file
	// Name is rate_limit.name ("" if none); it is what `replaces` refers to.
	Name string
	// Limits holds the limit built from rate_limit (first, when present)
	// followed by the `limits` entries in file order. It may be empty.
	Limits     []bucket.Limit
	Unlimited  bool
	ShadowMode bool
	// QuotaMode (quota_mode) makes an over-limit answer OK: the request
	// passes and the violation is reported instead (in the response's
	// dynamic metadata), as envoyproxy/ratelimit does for a soft quota.
	QuotaMode bool
	// Global (global) marks the node's limits, whatever level they
	// resolve from, as one limit for the whole fleet across regions: a
	// replica configured with its region and the regions' weights
	// enforces its region's part of each (backend.Global).
	Global bool
	// DetailedMetric and ValueToMetric put request values into the rule's
	// stats key (StatsKey): every value of the request, or the value of
	// this level.
	DetailedMetric bool
	ValueToMetric  bool
	// Metadata is the node's free-form `metadata` mapping, nil when it has
	// none: what envoyproxy/ratelimit merges into the response's dynamic
	// metadata for the rules a request matched. Values are those a
	// google.protobuf.Struct holds (map[string]any, []any, float64, bool,
	// string, nil).
	Metadata map[string]any
	// Replaces lists the rule names (rate_limit.replaces) this rule removes
	// from the request when both match.
	Replaces []string
	// Charges (charges) says which calls on the rule's limits are charges
	// of tokens already used, which land whatever the limits hold.
	Charges Charges

	key      string
	value    string // as written; "" for a bare node
	kind     nodeKind
	pattern  pattern // compiled value, for a wildcard node
	share    bool    // share_threshold: a wildcard level that keeps its value out of the entity
	children level   // nil when the node has no children
	up       *Rule   // the parent node; nil at the top level

	// entityLevels are the indexes of the request entries whose values form
	// the default entity: the levels of the path matched by bare key or by a
	// wildcard without share_threshold. Precomputed because it is static.
	entityLevels []int
	entity       *template // nil: use the default entity
	resource     *template // nil: use Path
	parent       *template // nil: no parent

	// unnamedRateLimit records that Limits[0] came from a rate_limit block
	// without a name: it is stored as "default" but reported as "".
	unnamedRateLimit bool
	// override marks the rule built for a descriptor's own limit.
	override bool
}

// nodeKind is how a node matches the value of a request entry.
type nodeKind uint8

const (
	kindBare     nodeKind = iota // no value: any value
	kindExact                    // value without '*'
	kindWildcard                 // value with at least one '*'
)

// ReportedName is the name Sluice reports in current_limit.name for the limit
// with this Name: the limit's own name, except that the limit built from an
// unnamed `rate_limit` is stored as "default" and reported as "" (as
// envoyproxy/ratelimit reports it).
func (r *Rule) ReportedName(limitName string) string {
	if r.unnamedRateLimit && limitName == defaultLimitName {
		return ""
	}
	return limitName
}

// Charges says which calls on a rule's limits count tokens already used
// (a response's, reported when it ended), which land whatever the limits
// hold and may put them into debt (backend.Request.Charge), rather than
// ask for tokens, which a limit that cannot pay denies and takes nothing
// for. Envoy sends no flag: a gateway that charges after the response
// (Envoy Gateway's cost.response, Envoy AI Gateway, agentgateway) sends
// the tokens as the descriptor's own hits_addend, which a request
// otherwise rarely carries.
//
// The zero Charges is ChargesOwnHits.
type Charges uint8

const (
	// ChargesOwnHits: a descriptor that carries its own hits_addend above
	// zero is a charge; one without (a plain request: one hit, or the
	// request's hits_addend) asks, so that a flood of requests at an
	// exhausted limit takes nothing. The default, for rule files in
	// envoyproxy/ratelimit's format and rules over xDS too.
	ChargesOwnHits Charges = iota
	// ChargesAlways: every call with hits is a charge, as
	// envoyproxy/ratelimit counts them (a denied request counts too).
	ChargesAlways
	// ChargesNever: no call is a charge; one that does not fit is denied
	// and takes nothing.
	ChargesNever
)

// String is the rule-file spelling of c.
func (c Charges) String() string {
	switch c {
	case ChargesAlways:
		return "always"
	case ChargesNever:
		return "never"
	}
	return "own_hits"
}

// parseCharges reads the rule-file spelling of a Charges.
func parseCharges(s string) (Charges, bool) {
	for _, c := range []Charges{ChargesOwnHits, ChargesAlways, ChargesNever} {
		if c.String() == s {
			return c, true
		}
	}
	return 0, false
}
