package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/regions"
)

// A region's share record of a global key (regions.Record) is a hash of
// its own, {prefix}:s:{entity}:{resource}, with the record ("sh") and a
// version ("ver"). Only the sync writes it, by a script that writes on
// the condition that the version is still the one the write was planned
// from, so two syncs of one region never write over each other's loans;
// an operator's config is another key, never touched by it.
const (
	fieldShare    = "sh"
	fieldShareVer = "ver"

	// putShareLua writes the share hash KEYS[1] (record ARGV[3], version
	// ARGV[2], expiring at ARGV[4] epoch ms, "0": never) if its version
	// is still ARGV[1] ("0": none), and answers 1; else 0, writing
	// nothing.
	putShareLua = `
local v = redis.call('HGET', KEYS[1], 'ver')
if (v or '0') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'ver', ARGV[2], 'sh', ARGV[3])
if ARGV[4] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[4]) end
return 1`
)

// Share is the key of entity's share record for resource.
func (k Keys) Share(entity, resource string) string {
	return k.base() + ":s:" + seg(entity) + ":" + seg(resource)
}

// GetShare reads the share record of entity's bucket for resource and
// the version it is at: 0, with the zero Record, when none is stored. One
// that does not decode is an error, never "none": a region taken as
// holding no loans enforces its whole base. With PutShare, an Admin is a
// sync's Store (regions/syncer).
func (a *Admin) GetShare(ctx context.Context, entity, resource string) (regions.Record, int64, error) {
	if entity == "" || resource == "" {
		return regions.Record{}, 0, fmt.Errorf("a share record needs an entity and a resource, got %q and %q", entity, resource)
	}
	h, err := a.client.Do(ctx, a.client.B().Hgetall().Key(a.keys.Share(entity, resource)).Build()).AsStrMap()
	if err != nil {
		return regions.Record{}, 0, fmt.Errorf("reading the share of %q/%q: %w", entity, resource, err)
	}
	return decodeShare(h, entity, resource)
}

// GetShares reads the share records of keys, lined up with keys, in one
// pipeline: a sync reads every key a window's round plans at once, not
// one round trip per key. Redis answers from its primary, so consistent
// changes nothing. An error is for the whole call, a record that does
// not decode for its key alone.
func (a *Admin) GetShares(ctx context.Context, keys []regions.Key, consistent bool) ([]regions.Stored, error) {
	out := make([]regions.Stored, len(keys))
	cmds := make(rueidis.Commands, 0, len(keys))
	at := make([]int, 0, len(keys))
	for i, k := range keys {
		if k.Entity == "" || k.Resource == "" {
			out[i].Err = fmt.Errorf("a share record needs an entity and a resource, got %q and %q", k.Entity, k.Resource)
			continue
		}
		cmds = append(cmds, a.client.B().Hgetall().Key(a.keys.Share(k.Entity, k.Resource)).Build())
		at = append(at, i)
	}
	for j, res := range a.client.DoMulti(ctx, cmds...) {
		i := at[j]
		h, err := res.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("reading the share of %q/%q: %w", keys[i].Entity, keys[i].Resource, err)
		}
		out[i].Record, out[i].Version, out[i].Err = decodeShare(h, keys[i].Entity, keys[i].Resource)
	}
	return out, nil
}

// decodeShare reads a share hash (none: the zero Record at version 0).
func decodeShare(h map[string]string, entity, resource string) (regions.Record, int64, error) {
	if len(h) == 0 {
		return regions.Record{}, 0, nil
	}
	ver, err := strconv.ParseInt(h[fieldShareVer], 10, 64)
	if err != nil || ver < 1 {
		return regions.Record{}, 0, fmt.Errorf("the share of %q/%q: version %q", entity, resource, h[fieldShareVer])
	}
	rec, err := regions.Decode([]byte(h[fieldShare]))
	if err != nil {
		return regions.Record{}, 0, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	return rec, ver, nil
}

// PutShare writes rec as the share record of entity's bucket for
// resource, on the condition that the stored one is still at version (0:
// that none is stored), and returns the new version. expireAt (epoch
// milliseconds, 0 for never) lets Redis drop the hash once its loans are
// over. A lost condition is regions.ErrShareChanged.
func (a *Admin) PutShare(ctx context.Context, entity, resource string, rec regions.Record, version, expireAt int64) (int64, error) {
	if entity == "" || resource == "" {
		return 0, fmt.Errorf("a share record needs an entity and a resource, got %q and %q", entity, resource)
	}
	b, err := regions.Encode(rec)
	if err != nil {
		return 0, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	args := []string{strconv.FormatInt(version, 10), strconv.FormatInt(version+1, 10), string(b), strconv.FormatInt(max(expireAt, 0), 10)}
	ok, err := a.scripts.putShare.Exec(ctx, a.client, []string{a.keys.Share(entity, resource)}, args).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("writing the share of %q/%q: %w", entity, resource, err)
	}
	if ok != 1 {
		return 0, fmt.Errorf("the share of %q/%q at version %d: %w", entity, resource, version, regions.ErrShareChanged)
	}
	return version + 1, nil
}

// readShare reads the share record of entity's bucket for resource for a
// decision (sharecache). None stored is the zero Record.
func (b *Backend) readShare(ctx context.Context, entity, resource string) (regions.Record, error) {
	var h map[string]string
	err := b.opts.round(ctx, "HGETALL", func(ctx context.Context) (err error) {
		h, err = b.client.Do(ctx, b.client.B().Hgetall().Key(b.keys.Share(entity, resource)).Build()).AsStrMap()
		return err
	})
	if err != nil {
		return regions.Record{}, fmt.Errorf("reading the share of %q/%q: %w", entity, resource, err)
	}
	rec, _, err := decodeShare(h, entity, resource)
	return rec, err
}
