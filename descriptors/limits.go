package descriptors

import (
	"math"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
)

// isEnvoyUnit reports whether unit is one of the rate_limit units of
// envoyproxy/ratelimit (case-insensitive). bucket.ParseUnit also takes
// abbreviations such as "s" or "min"; rate_limit keeps to envoyproxy's
// vocabulary so that a file Sluice accepts means the same to both services.
func isEnvoyUnit(unit string) bool {
	switch strings.ToLower(unit) {
	case "second", "minute", "hour", "day", "week", "month", "year":
		return true
	}
	return false
}

// rateLimit parses the envoyproxy/ratelimit `rate_limit` block of a node.
func (p *fileParser) rateLimit(r *Rule, f map[string]field) {
	rf, ok := f["rate_limit"]
	if !ok || (rf.val.Kind == yaml.ScalarNode && rf.val.ShortTag() == "!!null") {
		return
	}
	if !p.isMapping(rf.val, "rate_limit") {
		return
	}
	g := p.fields(rf.val, "rate_limit", "unit", "requests_per_unit", "unlimited", "name", "replaces")
	if nf, ok := g["name"]; ok {
		r.Name, _ = p.str(nf.val, "rate_limit.name")
	}
	r.Unlimited = p.boolField(g, "unlimited")
	var rpu uint32
	if nf, ok := g["requests_per_unit"]; ok {
		if nf.val.Kind != yaml.ScalarNode || nf.val.ShortTag() != "!!int" || nf.val.Decode(&rpu) != nil {
			p.errorf(nf.val.Line, "rate_limit.requests_per_unit: want a whole number from 0 to %d, got %s", uint32(math.MaxUint32), kindName(nf.val))
		}
	}
	var unit string
	uf, hasUnit := g["unit"]
	if hasUnit {
		unit, _ = p.str(uf.val, "rate_limit.unit")
	}
	switch {
	case r.Unlimited:
		if unit != "" {
			p.errorf(uf.key.Line, "rate_limit: an unlimited rate limit must not have a unit")
		}
	case unit == "":
		p.errorf(rf.key.Line, "rate_limit: missing unit (want second, minute, hour, day, week, month or year)")
	default:
		period, err := bucket.ParseUnit(unit)
		if err != nil || !isEnvoyUnit(unit) {
			p.errorf(uf.val.Line, "rate_limit.unit: invalid unit %q (want second, minute, hour, day, week, month or year)", unit)
			break
		}
		name := r.Name
		if name == "" {
			name, r.unnamedRateLimit = defaultLimitName, true
		}
		amount := int64(rpu) * bucket.Milli
		r.Limits = append(r.Limits, bucket.Limit{Name: name, Amount: amount, Period: period, Burst: amount})
	}
	p.replaces(r, g)
}

// replaces parses rate_limit.replaces: a list of {name}.
func (p *fileParser) replaces(r *Rule, g map[string]field) {
	items, ok := p.sequenceOf(g, "replaces", "rate_limit.replaces")
	if !ok {
		return
	}
	for _, it := range p.mappings(items, "rate_limit.replaces entry") {
		h := p.fields(it, "rate_limit.replaces entry", "name")
		nf, ok := h["name"]
		if !ok {
			p.errorf(it.Line, "rate_limit.replaces: entry has no name")
			continue
		}
		name, ok := p.str(nf.val, "rate_limit.replaces.name")
		switch {
		case !ok:
		case name == "":
			p.errorf(nf.key.Line, "rate_limit.replaces: empty name")
		case name == r.Name:
			p.errorf(nf.val.Line, "rate_limit.replaces: %q is the name of this rule itself", name)
		default:
			r.Replaces = append(r.Replaces, name)
		}
	}
}

// limits parses the Sluice `limits` list of a node, after rate_limit so that
// names are checked against the rate_limit limit too.
func (p *fileParser) limits(r *Rule, f map[string]field) {
	lf, ok := f["limits"]
	if !ok {
		return
	}
	items, ok := p.sequenceOf(f, "limits", "limits")
	if !ok {
		return
	}
	if r.Unlimited && len(items) > 0 {
		p.errorf(lf.key.Line, "limits: an unlimited rule (rate_limit.unlimited) must not have limits")
		return
	}
	for _, it := range p.mappings(items, "limits entry") {
		if l, ok := p.limit(it); ok {
			if hasLimit(r, l.Name) {
				p.errorf(it.Line, "limits: name %q is used twice in this descriptor", l.Name)
				continue
			}
			if slices.Contains(r.Replaces, l.Name) {
				p.errorf(it.Line, "rate_limit.replaces: %q is the name of a limit of this rule itself", l.Name)
				continue
			}
			r.Limits = append(r.Limits, l)
		}
	}
}

// hasLimit reports whether r already has a limit called name.
func hasLimit(r *Rule, name string) bool {
	for _, l := range r.Limits {
		if l.Name == name {
			return true
		}
	}
	return false
}

// wholeTokens reads the field key of limit name's entry g, a whole number
// of tokens from 0 to bucket.MaxTokens: present is false when the entry
// has none, ok false (with the error reported) when it is not such a
// number.
func (p *fileParser) wholeTokens(g map[string]field, key, name string) (n int64, present, ok bool) {
	f, present := g[key]
	if !present {
		return 0, false, true
	}
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() != "!!int" || f.val.Decode(&n) != nil || n < 0 || n > bucket.MaxTokens {
		p.errorf(f.val.Line, "limit %q: %s: want a whole number of tokens from 0 to %d, got %s", name, key, bucket.MaxTokens, kindName(f.val))
		return 0, true, false
	}
	return n, true, true
}

// limit parses one entry of `limits`: {name, rate, burst, cost, debt,
// period, zone}.
func (p *fileParser) limit(n *yaml.Node) (bucket.Limit, bool) {
	g := p.fields(n, "limits entry", "name", "rate", "burst", "cost", "debt", "period", "zone")
	var l bucket.Limit
	nf, ok := g["name"]
	if !ok {
		p.errorf(n.Line, "limits: entry has no name")
		return l, false
	}
	if l.Name, ok = p.str(nf.val, "limits.name"); !ok {
		return l, false
	}
	if l.Name == "" {
		p.errorf(nf.key.Line, "limits: empty name")
		return l, false
	}
	rf, ok := g["rate"]
	if !ok {
		p.errorf(n.Line, "limit %q: missing rate (e.g. rate: 100/min)", l.Name)
		return l, false
	}
	rate, ok := p.str(rf.val, "limits.rate")
	if !ok {
		return l, false
	}
	if !p.calendar(&l, g, rate, rf.val.Line) {
		return l, false
	}
	l.Burst = l.Amount
	if burst, present, ok := p.wholeTokens(g, "burst", l.Name); !ok {
		return l, false
	} else if present {
		l.Burst = burst * bucket.Milli
	}
	if debt, present, ok := p.wholeTokens(g, "debt", l.Name); !ok {
		return l, false
	} else if present {
		l.Debt = debt * bucket.Milli
		if debt == 0 {
			l.Debt = bucket.NoDebt
		}
	}
	if cf, ok := g["cost"]; ok {
		cost, ok := p.str(cf.val, "limits.cost")
		if !ok {
			return l, false
		}
		switch cost {
		case "hits":
		case "request":
			l.PerRequest = true
		default:
			p.errorf(cf.val.Line, "limit %q: cost: want hits or request, got %q", l.Name, cost)
			return l, false
		}
	}
	if err := l.Validate(); err != nil {
		p.errorf(n.Line, "%v", err)
		return l, false
	}
	return l, true
}

// calendar reads limit l's rate, and its period and zone if it is a
// budget (a limit with `period: month`, or `zone` and a rate whose unit
// is a period), into l. An unknown period or zone is refused at its own
// line. Limits of one file that name one zone share its Location, so
// that they compare equal (bucket.Limit.Zone).
func (p *fileParser) calendar(l *bucket.Limit, g map[string]field, rate string, rateLine int) bool {
	spec := bucket.Spec{Name: l.Name, Rate: rate}
	line := rateLine
	if f, ok := g["period"]; ok {
		if spec.Period, ok = p.str(f.val, "limits.period"); !ok {
			return false
		}
		if _, err := period.ParseUnit(spec.Period); err != nil {
			p.errorf(f.val.Line, "limit %q: period: %v", l.Name, err)
			return false
		}
	}
	if f, ok := g["zone"]; ok {
		if spec.Zone, ok = p.str(f.val, "limits.zone"); !ok {
			return false
		}
		if _, err := p.zone(spec.Zone); err != nil {
			p.errorf(f.val.Line, "limit %q: zone: %v", l.Name, err)
			return false
		}
		if spec.Period == "" && !strings.Contains(rate, "/") {
			line = f.val.Line
		}
	}
	if spec.Period == "" && spec.Zone == "" {
		var err error
		if l.Amount, l.Period, err = bucket.ParseRate(rate); err != nil {
			p.errorf(rateLine, "limit %q: %v", l.Name, err)
			return false
		}
		return true
	}
	b, err := spec.Limit()
	if err != nil {
		p.errorf(line, "%v", err)
		return false
	}
	l.Amount, l.Period, l.Calendar = b.Amount, b.Period, b.Calendar
	l.Zone, _ = p.zone(spec.Zone)
	return true
}

// zone loads the time zone called name once per file.
func (p *fileParser) zone(name string) (*time.Location, error) {
	if loc, ok := p.zones[name]; ok {
		return loc, nil
	}
	loc, err := period.LoadZone(name)
	if err != nil {
		return nil, err
	}
	if p.zones == nil {
		p.zones = map[string]*time.Location{}
	}
	p.zones[name] = loc
	return loc, nil
}
