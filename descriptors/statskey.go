package descriptors

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// StatsKey returns the name envoyproxy/ratelimit gives the counters of a
// request that matched r (entries are the request descriptor's, as given
// to Match): the domain, then one segment per level joined with '.'. It
// is what dashboards built for that service read (as the `key1`... labels
// of its Prometheus metrics), so it follows that service's rules exactly:
//
//   - a level matched by an exact value is "key_value";
//   - a level matched by a bare key is "key", or "key_<request value>"
//     when the level sets value_to_metric (an empty value adds nothing);
//   - a level matched by a wildcard is "key_<pattern>", or
//     "key_<request value>" when the level sets value_to_metric, unless it
//     sets share_threshold, whose buckets the pattern names;
//   - when the matched rule itself sets detailed_metric, every level
//     shows its request value as if it set value_to_metric (a
//     share_threshold level still shows its pattern);
//   - a descriptor with its own limit (an override) is named by all its
//     keys and values: "key_value" per entry, "key" for an empty value.
func (r *Rule) StatsKey(entries []*rlv3.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(r.Domain)
	if r.override {
		for _, e := range entries {
			b.WriteByte('.')
			b.WriteString(e.GetKey())
			if v := e.GetValue(); v != "" {
				b.WriteByte('_')
				b.WriteString(v)
			}
		}
		return b.String()
	}
	var path []*Rule
	for n := r; n != nil; n = n.up {
		path = append(path, n)
	}
	for i := len(path) - 1; i >= 0; i-- {
		n := path[i]
		b.WriteByte('.')
		b.WriteString(n.key)
		var v string
		if j := len(path) - 1 - i; j < len(entries) {
			v = entries[j].GetValue()
		}
		withValue := n.ValueToMetric || r.DetailedMetric
		switch {
		case n.kind == kindExact:
			b.WriteByte('_')
			b.WriteString(n.value)
		case n.kind == kindWildcard && (n.share || !withValue):
			b.WriteByte('_')
			b.WriteString(n.value)
		case withValue && v != "":
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}
