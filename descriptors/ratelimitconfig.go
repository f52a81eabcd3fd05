package descriptors

import (
	"fmt"
	"strings"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
)

// FromRateLimitConfigs builds a Config from the RateLimitConfig resources
// an xDS server sends (ratelimit.config.ratelimit.v3, what Envoy Gateway
// sends envoyproxy/ratelimit), each the same as one rule file: its domain,
// its name, its descriptors. They are checked exactly as files are, by
// the same parser; each resource is named in the errors as
// "xds:<its name>" (or "xds:<its domain>" when it has no name), followed
// by the line of the YAML it reads as, which the message quotes.
func FromRateLimitConfigs(cfgs []*rlconfv3.RateLimitConfig) (*Config, error) {
	files := make(map[string][]byte, len(cfgs))
	for i, c := range cfgs {
		name := c.GetName()
		if name == "" {
			name = c.GetDomain()
		}
		file := "xds:" + name
		if _, dup := files[file]; dup || name == "" {
			file = fmt.Sprintf("xds:%s#%d", name, i)
		}
		node, err := configNode(c)
		if err != nil {
			return nil, &Error{File: file, Msg: err.Error(), Err: err}
		}
		data, err := yaml.Marshal(node)
		if err != nil {
			return nil, &Error{File: file, Msg: "cannot render as rules: " + err.Error(), Err: err}
		}
		files[file] = data
	}
	return Parse(files)
}

// configNode is c as the rule file that says the same.
func configNode(c *rlconfv3.RateLimitConfig) (*yaml.Node, error) {
	m := mapping()
	if c.GetName() != "" {
		put(m, "name", scalar(c.GetName()))
	}
	put(m, "domain", scalar(c.GetDomain()))
	if len(c.GetDescriptors()) > 0 {
		ds, err := descriptorNodes(c.GetDescriptors())
		if err != nil {
			return nil, err
		}
		put(m, "descriptors", ds)
	}
	return m, nil
}

func descriptorNodes(ds []*rlconfv3.RateLimitDescriptor) (*yaml.Node, error) {
	list := &yaml.Node{Kind: yaml.SequenceNode}
	for _, d := range ds {
		m := mapping()
		put(m, "key", scalar(d.GetKey()))
		if d.GetValue() != "" {
			put(m, "value", scalar(d.GetValue()))
		}
		if p := d.GetRateLimit(); p != nil {
			rl := mapping()
			if p.GetUnit() != rlconfv3.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
				// UNKNOWN is the proto's zero: a rate without a unit, which
				// the parser refuses by name, unless the rule is unlimited.
				put(rl, "unit", scalar(strings.ToLower(p.GetUnit().String())))
			}
			put(rl, "requests_per_unit", typed("!!int", fmt.Sprint(p.GetRequestsPerUnit())))
			if p.GetUnlimited() {
				put(rl, "unlimited", typed("!!bool", "true"))
			}
			if p.GetName() != "" {
				put(rl, "name", scalar(p.GetName()))
			}
			if len(p.GetReplaces()) > 0 {
				rs := &yaml.Node{Kind: yaml.SequenceNode}
				for _, r := range p.GetReplaces() {
					e := mapping()
					put(e, "name", scalar(r.GetName()))
					rs.Content = append(rs.Content, e)
				}
				put(rl, "replaces", rs)
			}
			put(m, "rate_limit", rl)
		}
		for _, b := range []struct {
			key string
			on  bool
		}{{"shadow_mode", d.GetShadowMode()}, {"detailed_metric", d.GetDetailedMetric()}, {"quota_mode", d.GetQuotaMode()}} {
			if b.on {
				put(m, b.key, typed("!!bool", "true"))
			}
		}
		if md := d.GetMetadata(); md != nil {
			// Refused, not dropped: a rule must not load without its metadata.
			var n yaml.Node
			if err := n.Encode(md.AsMap()); err != nil {
				return nil, fmt.Errorf("descriptor %q: metadata: %w", d.GetKey(), err)
			}
			put(m, "metadata", &n)
		}
		if len(d.GetDescriptors()) > 0 {
			children, err := descriptorNodes(d.GetDescriptors())
			if err != nil {
				return nil, err
			}
			put(m, "descriptors", children)
		}
		list.Content = append(list.Content, m)
	}
	return list, nil
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode} }

// scalar is a string node: tagged, so that the YAML it renders as quotes
// whatever would read back as something else ("null", "true", "*").
func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

// typed is a number or boolean node.
func typed(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }

func put(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, scalar(key), v)
}
