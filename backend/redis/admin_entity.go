package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// PutEntity writes e's META, replacing what was there. A change of parent
// or cascade moves the entity's buckets (and its children's) to another
// hash tag: the serving replicas start them full there once their config
// cache lets them see the change, and the old ones expire by their TTL.
func (a *Admin) PutEntity(ctx context.Context, e backend.Entity) error {
	if err := e.Validate(); err != nil {
		return err
	}
	// The name in the clear, as on a config: a key segment past
	// keyseg.MaxLen bytes is a hash.
	args := append([]string{"0"}, metaFields(e)...)
	args = append(args, fieldEntity, e.Name)
	if err := a.scripts.replaceHash.Exec(ctx, a.client, []string{a.keys.Meta(e.Name)}, args).Error(); err != nil {
		return fmt.Errorf("writing META of %q: %w", e.Name, err)
	}
	return nil
}

// GetEntity reads name's META.
func (a *Admin) GetEntity(ctx context.Context, name string) (backend.Entity, bool, error) {
	h, err := a.client.Do(ctx, a.client.B().Hgetall().Key(a.keys.Meta(name)).Build()).AsStrMap()
	if err != nil {
		return backend.Entity{}, false, fmt.Errorf("reading META of %q: %w", name, err)
	}
	if len(h) == 0 {
		return backend.Entity{}, false, nil
	}
	return decodeEntity(name, h), true, nil
}

// Children calls fn for every entity whose META names parent, in the
// order of their names. Redis has no index of parents: this SCANs every
// META of the deployment and reads each, so its cost grows with the
// number of entities that have one. Unlike DynamoDB's index, it sees a
// META written a moment ago.
func (a *Admin) Children(ctx context.Context, parent string, fn func(backend.Entity) error) error {
	var kids []backend.Entity
	metaPrefix := a.keys.base() + ":m:"
	err := a.scan(ctx, metaPrefix+"*", func(keys []string) error {
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = a.client.B().Hgetall().Key(k).Build()
		}
		for i, res := range a.client.DoMulti(ctx, cmds...) {
			h, err := res.AsStrMap()
			if err != nil {
				return fmt.Errorf("reading %s: %w", keys[i], err)
			}
			if len(h) == 0 || h[fieldParent] != parent {
				continue // another's child, or gone since the SCAN
			}
			name, ok := h[fieldEntity]
			if !ok {
				name = unseg(strings.TrimPrefix(keys[i], metaPrefix))
			}
			kids = append(kids, decodeEntity(name, h))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("children of %q: %w", parent, err)
	}
	slices.SortFunc(kids, func(x, y backend.Entity) int { return strings.Compare(x.Name, y.Name) })
	for _, k := range kids {
		if err := fn(k); err != nil {
			return err
		}
	}
	return nil
}

// entityPatterns are the SCAN patterns of entity's configs and of its
// buckets, whatever their hash tag. A segment never holds ':' (nor a
// brace), so the entity's segment between two ':' matches that entity
// alone: "acme" not "acme2".
func (a *Admin) entityPatterns(entity string) (configs, buckets string) {
	e := globEscape(seg(entity))
	return a.keys.base() + ":c:e:" + e + ":*", a.keys.base() + ":b:{*}:" + e + ":*"
}

// DeleteEntity deletes every key of entity (its META, its configs and its
// buckets, under whatever hash tag) and returns how many it deleted. The
// configs and buckets are found by SCAN, so the cost grows with the
// keyspace; a bucket the serving replicas write meanwhile may survive,
// and it expires by its TTL unless its limits come from an operator's
// entity config, which this deletes.
func (a *Admin) DeleteEntity(ctx context.Context, entity string) (int, error) {
	deleted := 0
	del := func(keys []string) error {
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			// One key a DEL: in a Cluster the keys are in many slots.
			cmds[i] = a.client.B().Del().Key(k).Build()
		}
		for i, res := range a.client.DoMulti(ctx, cmds...) {
			n, err := res.AsInt64()
			if err != nil {
				return fmt.Errorf("deleting %s: %w", keys[i], err)
			}
			deleted += int(n)
		}
		return nil
	}
	configs, buckets := a.entityPatterns(entity)
	err := del([]string{a.keys.Meta(entity)})
	if err == nil {
		err = a.scan(ctx, configs, del)
	}
	if err == nil {
		err = a.scan(ctx, buckets, del)
	}
	if err != nil {
		return deleted, fmt.Errorf("deleting entity %q: %w", entity, err)
	}
	return deleted, nil
}

// top is the end of the chain of cascade parents that starts at entity,
// found as Backend.Decide finds it (through each link's META, at most
// maxChain links past the entity's own parent): the hash tag of entity's
// buckets.
func (a *Admin) top(ctx context.Context, entity string) (string, error) {
	for range maxChain + 1 {
		e, _, err := a.GetEntity(ctx, entity)
		if err != nil {
			return "", err
		}
		if !e.Cascade || e.Parent == "" || e.Parent == entity {
			break
		}
		entity = e.Parent
	}
	return entity, nil
}

// bucketSegments splits a bucket key into the segments of its hash tag,
// entity and resource.
func (a *Admin) bucketSegments(key string) (tag, entity, resource string, ok bool) {
	rest, ok := strings.CutPrefix(key, a.keys.base()+":b:{")
	if !ok {
		return "", "", "", false
	}
	tag, rest, ok = strings.Cut(rest, "}:")
	if !ok {
		return "", "", "", false
	}
	entity, resource, ok = strings.Cut(rest, ":")
	if !ok || strings.Contains(resource, ":") {
		return "", "", "", false
	}
	return tag, entity, resource, true
}

// Fields of a bucket's hash, as decide.lua writes them: cfg (the
// fingerprint of its limits) and per limit b_{limit}_{tk,rf,tc} besides
// the limit's own ra, rp, bx and cp.
const (
	bucketPrefix  = "b_"
	fieldCfg      = "cfg"
	fieldTokens   = "tk"
	fieldClock    = "rf"
	fieldConsumed = "tc"
	// fieldOutList lists what leases hold of a limit by expiry window
	// ("window:tokens,..."), fieldDebt how far below zero a charge may take
	// it (bucket.Limit.Debt; absent for the default).
	fieldOutList = "ol"
	fieldDebt    = "db"
)

// decodeBucket reads a bucket hash as decide.lua writes it: cfg, and
// b_{limit}_{tk,rf,tc,cp,bx,ra,rp} per limit (a limit name may hold any
// character, so the field is whatever follows the last '_'). Limits come
// in the order of their names.
func decodeBucket(h map[string]string) (backend.Bucket, error) {
	b := backend.Bucket{Cfg: h[fieldCfg]}
	byName := map[string]map[string]int64{}
	cals := map[string]string{}
	for field, v := range h {
		rest, ok := strings.CutPrefix(field, bucketPrefix)
		i := strings.LastIndexByte(rest, '_')
		if !ok || i <= 0 {
			continue
		}
		name, what := rest[:i], rest[i+1:]
		if byName[name] == nil {
			byName[name] = map[string]int64{}
		}
		if what == fieldCalendar {
			cals[name] = v
			continue
		}
		if what == fieldOutList {
			out, err := leasedSum(v)
			if err != nil {
				return backend.Bucket{}, fmt.Errorf("field %s: %w", field, err)
			}
			byName[name][what] = out
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return backend.Bucket{}, fmt.Errorf("field %s: %q is not an integer", field, v)
		}
		byName[name][what] = n
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		f := byName[name]
		l := bucket.Limit{Name: name, Amount: f[fieldAmount], Period: f[fieldPeriod], Burst: f[fieldBurst], Debt: f[fieldDebt]}
		var err error
		if l.Calendar, l.Zone, err = bucket.ParseCalendarKey(cals[name]); err != nil {
			return backend.Bucket{}, fmt.Errorf("limit %q: %w", name, err)
		}
		b.Limits = append(b.Limits, l)
		st := bucket.State{Tokens: f[fieldTokens], Clock: f[fieldClock], Consumed: f[fieldConsumed]}
		if out := f[fieldOutList]; out > 0 {
			// What the fleet's leases hold, as one slot that never ends:
			// all a reader needs of them is their sum.
			st.Out[0] = bucket.Out{Window: math.MaxInt64, Tokens: out}
		}
		b.States = append(b.States, st)
	}
	return b, nil
}

// leasedSum is the sum of what a limit's leases hold, from its field ol
// ("window:tokens,..."; empty when none is out).
func leasedSum(v string) (int64, error) {
	var sum int64
	for _, part := range strings.Split(v, ",") {
		if part == "" {
			continue
		}
		_, tokens, ok := strings.Cut(part, ":")
		n, err := strconv.ParseInt(tokens, 10, 64)
		if !ok || err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a list of window:tokens", v)
		}
		sum += n
	}
	return sum, nil
}

// readBuckets reads the bucket hashes at keys and their expiry, pipelined,
// and calls fn for each that still exists, named from its key (a name
// past keyseg.MaxLen bytes by its encoding).
func (a *Admin) readBuckets(ctx context.Context, keys []string, fn func(key string, b backend.Bucket) error) error {
	cmds := make(rueidis.Commands, 0, 2*len(keys))
	for _, k := range keys {
		cmds = append(cmds, a.client.B().Hgetall().Key(k).Build(), a.client.B().Pttl().Key(k).Build())
	}
	res := a.client.DoMulti(ctx, cmds...)
	now := a.now()
	for i, k := range keys {
		h, err := res[2*i].AsStrMap()
		if err != nil {
			return fmt.Errorf("reading %s: %w", k, err)
		}
		pttl, err := res[2*i+1].AsInt64()
		if err != nil {
			return fmt.Errorf("reading the expiry of %s: %w", k, err)
		}
		if len(h) == 0 || pttl == -2 {
			continue // gone: never written, expired, or deleted since
		}
		b, err := decodeBucket(h)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", k, err)
		}
		if pttl > 0 {
			b.TTL = ceilSeconds(now + pttl)
		}
		if _, e, r, ok := a.bucketSegments(k); ok {
			b.Entity, b.Resource = unseg(e), unseg(r)
		}
		if err := fn(k, b); err != nil {
			return err
		}
	}
	return nil
}

// lastWrite is when b was last written, as far as its refill clocks tell:
// the latest of them.
func lastWrite(b backend.Bucket) int64 {
	var t int64
	for _, s := range b.States {
		t = max(t, s.Clock)
	}
	return t
}

// GetBucket reads the bucket of entity for resource. Its key is tagged by
// the top of entity's chain of cascade parents, followed here through the
// METAs as the serving replicas follow it. A bucket whose parent came from
// a rule's parent template instead is tagged by that parent's top, which
// only the rule files know: when the key of the METAs holds nothing,
// GetBucket SCANs for the bucket under any tag (the cost of a walk over
// the keyspace), and of several (left behind by a change of parent, until
// they expire) takes the one written last.
func (a *Admin) GetBucket(ctx context.Context, entity, resource string) (backend.Bucket, bool, error) {
	keys, found, err := a.bucketKeys(ctx, entity, resource)
	if err != nil || len(keys) == 0 {
		return backend.Bucket{}, false, err
	}
	return found, true, nil
}

// bucketKeys finds the hashes that hold the bucket of entity for
// resource: under the hash tag of its top entity now and, when none is
// there, under any (its chain of parents changed since it was written).
// found is the one last written.
func (a *Admin) bucketKeys(ctx context.Context, entity, resource string) (keys []string, found backend.Bucket, err error) {
	top, err := a.top(ctx, entity)
	if err != nil {
		return nil, found, fmt.Errorf("bucket %q/%q: %w", entity, resource, err)
	}
	keep := func(k string, b backend.Bucket) error {
		if len(keys) == 0 || lastWrite(b) > lastWrite(found) {
			found = b
		}
		keys = append(keys, k)
		return nil
	}
	if err := a.readBuckets(ctx, []string{a.keys.Bucket(entity, resource, top)}, keep); err != nil {
		return nil, found, fmt.Errorf("bucket %q/%q: %w", entity, resource, err)
	}
	if len(keys) == 0 {
		pattern := a.keys.base() + ":b:{*}:" + globEscape(seg(entity)) + ":" + globEscape(seg(resource))
		err := a.scan(ctx, pattern, func(ks []string) error { return a.readBuckets(ctx, ks, keep) })
		if err != nil {
			return nil, found, fmt.Errorf("bucket %q/%q: %w", entity, resource, err)
		}
	}
	found.Entity, found.Resource = entity, resource
	return keys, found, nil
}

// ResetBucket makes the bucket of entity for resource full again, as a
// bucket seen for the first time: every limit (limit empty: its hash is
// deleted) or the one named limit (its fields are deleted; the next run
// of the decision script finds it missing and writes it full, beside the
// others as they were). It returns the bucket as it was, and false when
// there was none. Tokens replicas hold on lease stay theirs, and are
// spent on top of the full bucket.
func (a *Admin) ResetBucket(ctx context.Context, entity, resource, limit string) (backend.Bucket, bool, error) {
	keys, b, err := a.bucketKeys(ctx, entity, resource)
	if err != nil || len(keys) == 0 {
		return b, false, err
	}
	if limit != "" && !slices.ContainsFunc(b.Limits, func(l bucket.Limit) bool { return l.Name == limit }) {
		names := make([]string, len(b.Limits))
		for i, l := range b.Limits {
			names[i] = l.Name
		}
		return b, true, fmt.Errorf("bucket %q/%q has no limit %q (it has %s)", entity, resource, limit, strings.Join(names, ", "))
	}
	for _, k := range keys {
		if limit == "" {
			if err := a.client.Do(ctx, a.client.B().Del().Key(k).Build()).Error(); err != nil {
				return b, true, fmt.Errorf("resetting bucket %q/%q: %w", entity, resource, err)
			}
			continue
		}
		fields, err := a.client.Do(ctx, a.client.B().Hkeys().Key(k).Build()).AsStrSlice()
		if err != nil {
			return b, true, fmt.Errorf("reading bucket %q/%q: %w", entity, resource, err)
		}
		var drop []string
		for _, f := range fields {
			if rest, ok := strings.CutPrefix(f, bucketPrefix+limit+"_"); ok && !strings.Contains(rest, "_") {
				drop = append(drop, f)
			}
		}
		if len(drop) == 0 {
			continue
		}
		// A cfg no limits have makes the next run rewrite the limits'
		// fields, the reset one's among them, from the stored ones.
		cmds := rueidis.Commands{a.client.B().Hdel().Key(k).Field(drop...).Build(),
			a.client.B().Hset().Key(k).FieldValue().FieldValue(fieldCfg, "reset").Build()}
		for _, r := range a.client.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return b, true, fmt.Errorf("resetting limit %q of bucket %q/%q: %w", limit, entity, resource, err)
			}
		}
	}
	return b, true, nil
}

// Buckets calls fn for every bucket of resource, found by a SCAN of every
// primary, so in no particular order and at the cost of a walk over the
// keyspace. An entity whose chain of parents changed may be listed twice,
// under its old hash tag and its new one, until the old bucket expires.
// Entities are named from the keys: one past keyseg.MaxLen bytes by its
// encoding (the bucket hashes, written by the decision script, do not
// repeat the names).
func (a *Admin) Buckets(ctx context.Context, resource string, fn func(backend.BucketRef) error) error {
	pattern := a.keys.base() + ":b:{*}:*:" + globEscape(seg(resource))
	err := a.scan(ctx, pattern, func(keys []string) error {
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = a.client.B().Hget().Key(k).Field(fieldCfg).Build()
		}
		for i, res := range a.client.DoMulti(ctx, cmds...) {
			cfg, err := res.ToString()
			if rueidis.IsRedisNil(err) {
				continue // gone since the SCAN
			}
			if err != nil {
				return fmt.Errorf("reading %s: %w", keys[i], err)
			}
			_, e, _, ok := a.bucketSegments(keys[i])
			if !ok {
				continue
			}
			if err := fn(backend.BucketRef{Entity: unseg(e), Resource: resource, Cfg: cfg}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("buckets of resource %q: %w", resource, err)
	}
	return nil
}

// AllBuckets calls fn for every bucket of the deployment, found by a SCAN
// of every primary (an audit, not a path for traffic). Redis drops a
// bucket when it expires, so none is Expired.
func (a *Admin) AllBuckets(ctx context.Context, fn func(backend.Bucket) error) error {
	err := a.scan(ctx, a.keys.base()+":b:*", func(keys []string) error {
		return a.readBuckets(ctx, keys, func(_ string, b backend.Bucket) error { return fn(b) })
	})
	if err != nil {
		return fmt.Errorf("scanning for buckets: %w", err)
	}
	return nil
}

// The applied set: which records the last `sluice limits apply` wrote, so
// the next one knows what a manifest no longer lists. It is one hash,
// {prefix}:a, with fields version (a counter) and records (JSON), never
// expiring; setAppliedLua replaces it only if its version is the one the
// apply read, so that two applies cannot both win.
const (
	fieldVersion = "version"
	fieldRecords = "records"
)

func (a *Admin) appliedKey() string { return a.keys.base() + ":a" }

// appliedRecord is one record of the applied set in its JSON.
type appliedRecord struct {
	Entity   string `json:"entity,omitempty"`
	Resource string `json:"resource,omitempty"`
}

// Applied returns the records the last apply wrote and the version to
// pass to SetApplied; version 0 means no apply has run.
func (a *Admin) Applied(ctx context.Context) ([]backend.RecordKey, int64, error) {
	vs, err := a.client.Do(ctx, a.client.B().Hmget().Key(a.appliedKey()).Field(fieldVersion, fieldRecords).Build()).ToArray()
	if err != nil {
		return nil, 0, fmt.Errorf("reading the applied set: %w", err)
	}
	if len(vs) != 2 || vs[0].IsNil() {
		return nil, 0, nil
	}
	v, _ := vs[0].ToString()
	version, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("the applied set: version %q is not an integer", v)
	}
	var recs []appliedRecord
	if js, err := vs[1].ToString(); err == nil && js != "" {
		if err := json.Unmarshal([]byte(js), &recs); err != nil {
			return nil, 0, fmt.Errorf("the applied set: %w", err)
		}
	}
	refs := make([]backend.RecordKey, len(recs))
	for i, r := range recs {
		refs[i] = backend.RecordKey{Entity: r.Entity, Resource: r.Resource}
	}
	return refs, version, nil
}

// SetApplied replaces the applied set, if its version is still version;
// otherwise it returns backend.ErrAppliedChanged.
func (a *Admin) SetApplied(ctx context.Context, refs []backend.RecordKey, version int64) error {
	recs := make([]appliedRecord, len(refs))
	for i, r := range refs {
		recs[i] = appliedRecord{Entity: r.Entity, Resource: r.Resource}
	}
	js, err := json.Marshal(recs)
	if err != nil {
		return fmt.Errorf("the applied set: %w", err)
	}
	n, err := a.scripts.setApplied.Exec(ctx, a.client, []string{a.appliedKey()},
		[]string{strconv.FormatInt(version, 10), strconv.FormatInt(version+1, 10), string(js)}).AsInt64()
	if err != nil {
		return fmt.Errorf("writing the applied set: %w", err)
	}
	if n == 0 {
		return backend.ErrAppliedChanged
	}
	return nil
}
