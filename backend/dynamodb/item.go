package dynamodb

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// Attribute names of bucket and config items beyond the keys. Limit
// attributes are "b_{limit}_{field}" on a bucket and "l_{limit}_{field}" on
// a config; a limit name may hold any character, so the field is whatever
// follows the last '_'.
const (
	attrCfg      = "cfg"
	attrParent   = "parent_id"
	attrCascade  = "cascade"
	attrEntity   = "entity"
	attrResource = "resource"

	bucketPrefix = "b_"
	configPrefix = "l_"

	fieldTokens   = "tk"
	fieldCapacity = "cp"
	fieldBurst    = "bx"
	fieldAmount   = "ra"
	fieldPeriod   = "rp"
	fieldConsumed = "tc"
	fieldClock    = "rf"
	fieldCost     = "cost"
	// How far below zero a charge may take the limit (bucket.Limit.Debt),
	// present only when it is not the default.
	fieldDebt = "db"
	// A budget's calendar (bucket.Limit.CalendarKey: "month/Europe/Berlin"),
	// a string, present only on a budget.
	fieldCalendar = "pd"
	// What leases hold of a limit (bucket.State.Out): their sum, the room
	// left for refill (the burst less the tokens and that sum, kept with
	// them so that every condition compares one attribute with a value),
	// and per slot the window and its tokens.
	fieldOut  = "ot"
	fieldRoom = "rm"
	// Since when the limit has stood at its room (bucket.State.AtRoomSince);
	// absent when it is below it or that is not known.
	fieldAtRoom = "fs"
)

// slotFields are the window and tokens attributes of lease slot i.
func slotFields(i int) (window, tokens string) {
	d := strconv.Itoa(i)
	return "w" + d, "o" + d
}

func limitAttr(prefix, name, field string) string { return prefix + name + "_" + field }

// bucketItem is one bucket item as stored: the state of every limit of one
// entity and resource. A bucketItem read from the table or returned by a
// write is never modified afterwards; it may be shared through the cache.
type bucketItem struct {
	cfg    string
	ttl    int64 // epoch seconds; 0: none
	limits []bucket.Limit
	states []bucket.State
	// legacy: some limit lacks the lease attributes (an item written
	// before they were kept) or they do not add up; the next write
	// rewrites it whole.
	legacy bool
}

// Expired reports whether the item's ttl has passed: DynamoDB deletes such
// items lazily, and until then they must count as absent (pitfall 9).
func (it *bucketItem) Expired(nowMs int64) bool {
	return it.ttl != 0 && it.ttl*1000 <= nowMs
}

// Config is the fingerprint of the limits the item was written under.
func (it *bucketItem) Config() string { return it.cfg }

// StateOf returns the state of the limit called name.
func (it *bucketItem) StateOf(name string) (bucket.State, bool) {
	for i, l := range it.limits {
		if l.Name == name {
			return it.states[i], true
		}
	}
	return bucket.State{}, false
}

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

func str(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

// decodeBucket reads a bucket item; nil for an absent item.
func decodeBucket(av map[string]types.AttributeValue) (*bucketItem, error) {
	if len(av) == 0 {
		return nil, nil
	}
	it := &bucketItem{}
	if s, ok := av[attrCfg].(*types.AttributeValueMemberS); ok {
		it.cfg = s.Value
	}
	var err error
	if n, ok := av[attrTTL].(*types.AttributeValueMemberN); ok {
		if it.ttl, err = strconv.ParseInt(n.Value, 10, 64); err != nil {
			return nil, fmt.Errorf("bucket item: ttl %q: %w", n.Value, err)
		}
	}
	fields, err := limitFields(av, bucketPrefix)
	if err != nil {
		return nil, fmt.Errorf("bucket item: %w", err)
	}
	for _, name := range fields.names {
		f := fields.values[name]
		l := bucket.Limit{Name: name, Amount: f[fieldAmount], Period: f[fieldPeriod], Burst: f[fieldBurst], Debt: f[fieldDebt]}
		if err := fields.calendar(&l); err != nil {
			return nil, fmt.Errorf("bucket item: %w", err)
		}
		it.limits = append(it.limits, l)
		st := bucket.State{Tokens: f[fieldTokens], Clock: f[fieldClock], Consumed: f[fieldConsumed], AtRoomSince: f[fieldAtRoom]}
		for i := range bucket.LeaseSlots {
			w, o := slotFields(i)
			st.Out[i] = bucket.Out{Window: f[w], Tokens: f[o]}
		}
		rm, hasRoom := f[fieldRoom]
		_, hasOut := f[fieldOut]
		if !hasRoom || !hasOut || f[fieldOut] != st.Leased() || st.Tokens+f[fieldOut]+rm != f[fieldBurst] {
			it.legacy = true
		}
		it.states = append(it.states, st)
	}
	return it, nil
}

type fieldSet struct {
	names  []string // in first-seen order
	values map[string]map[string]int64
	costs  map[string]string
	cals   map[string]string
}

// calendar sets l's budget calendar from fs; a rate has none.
func (fs fieldSet) calendar(l *bucket.Limit) error {
	var err error
	if l.Calendar, l.Zone, err = bucket.ParseCalendarKey(fs.cals[l.Name]); err != nil {
		return fmt.Errorf("limit %q: %w", l.Name, err)
	}
	return nil
}

// limitFields groups the numeric "{prefix}{limit}_{field}" attributes by
// limit. The string field cost (configs only) is kept apart.
func limitFields(av map[string]types.AttributeValue, prefix string) (fieldSet, error) {
	fs := fieldSet{values: map[string]map[string]int64{}, costs: map[string]string{}, cals: map[string]string{}}
	for attr, v := range av {
		rest, ok := strings.CutPrefix(attr, prefix)
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, '_')
		if i <= 0 {
			continue
		}
		name, field := rest[:i], rest[i+1:]
		if _, seen := fs.values[name]; !seen {
			fs.values[name] = map[string]int64{}
			fs.names = append(fs.names, name)
		}
		switch v := v.(type) {
		case *types.AttributeValueMemberN:
			n, err := strconv.ParseInt(v.Value, 10, 64)
			if err != nil {
				return fieldSet{}, fmt.Errorf("attribute %s: %q is not an integer", attr, v.Value)
			}
			fs.values[name][field] = n
		case *types.AttributeValueMemberS:
			switch field {
			case fieldCost:
				fs.costs[name] = v.Value
			case fieldCalendar:
				fs.cals[name] = v.Value
			}
		}
	}
	// Attribute maps have no order; keep limits in a stable one.
	slices.Sort(fs.names)
	return fs, nil
}

// decodeRecord reads a config item (levels 1 to 4) into a Record. An item
// whose ttl has passed counts as absent.
func decodeRecord(av map[string]types.AttributeValue, nowMs int64) (backend.Record, bool, error) {
	if len(av) == 0 {
		return backend.Record{}, false, nil
	}
	rec := backend.Record{}
	if n, ok := av[attrTTL].(*types.AttributeValueMemberN); ok {
		ttl, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			return backend.Record{}, false, fmt.Errorf("config item: ttl %q: %w", n.Value, err)
		}
		if ttl*1000 <= nowMs {
			return backend.Record{}, false, nil
		}
		rec.Synced = true
	}
	fields, err := limitFields(av, configPrefix)
	if err != nil {
		return backend.Record{}, false, fmt.Errorf("config item: %w", err)
	}
	for _, name := range fields.names {
		f := fields.values[name]
		l := bucket.Limit{Name: name, Amount: f[fieldAmount], Period: f[fieldPeriod], Burst: f[fieldBurst], Debt: f[fieldDebt]}
		if err := fields.calendar(&l); err != nil {
			return backend.Record{}, false, fmt.Errorf("config item: %w", err)
		}
		switch fields.costs[name] {
		case "", "hits":
		case "request":
			l.PerRequest = true
		default:
			return backend.Record{}, false, fmt.Errorf("config item: limit %q: cost %q", name, fields.costs[name])
		}
		if err := l.Validate(); err != nil {
			return backend.Record{}, false, fmt.Errorf("config item: %w", err)
		}
		rec.Limits = append(rec.Limits, l)
	}
	return rec, true, nil
}

// encodeRecord writes a Record's limits as config item attributes.
func encodeRecord(av map[string]types.AttributeValue, rec backend.Record) {
	for _, l := range rec.Limits {
		av[limitAttr(configPrefix, l.Name, fieldCapacity)] = num(l.Amount)
		av[limitAttr(configPrefix, l.Name, fieldBurst)] = num(l.Burst)
		av[limitAttr(configPrefix, l.Name, fieldAmount)] = num(l.Amount)
		av[limitAttr(configPrefix, l.Name, fieldPeriod)] = num(l.Period)
		if l.Debt != 0 {
			av[limitAttr(configPrefix, l.Name, fieldDebt)] = num(max(l.Debt, bucket.NoDebt))
		}
		if l.IsBudget() {
			av[limitAttr(configPrefix, l.Name, fieldCalendar)] = str(l.CalendarKey())
		}
		cost := "hits"
		if l.PerRequest {
			cost = "request"
		}
		av[limitAttr(configPrefix, l.Name, fieldCost)] = str(cost)
	}
}
