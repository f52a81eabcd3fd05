package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/keyseg"
)

// Fields an Admin adds to the config hashes it writes: the record's
// entity and resource in the clear, because a key segment past
// keyseg.MaxLen bytes is a hash that cannot be read back. decodeRecord
// ignores them (they lack the l_ prefix). A hash written by another tool
// without them is named from its key.
const (
	fieldEntity   = "entity"
	fieldResource = "resource"
)

// scanCount is the COUNT of every SCAN: keys the server looks at per
// call. Large enough that a listing of a big keyspace takes few round
// trips, small enough that no call blocks the server for long.
const scanCount = 1000

// maxPipeline bounds the commands sent in one pipeline, so that a long
// list of records is read in bounded replies.
const maxPipeline = 1000

// Admin reads and writes what operators manage in Redis: config records
// at every level, entities' META, the applied set of `sluice limits
// apply`, and (read-only) buckets. It answers what *dynamodb.Admin
// answers, with the same values (package backend's), so the operator's
// commands work on either store.
//
// It keeps no cache: every read goes to the primaries, so it shows Redis
// as it is; a running Sluice sees a change within its config cache TTL,
// and a bucket takes changed limits on its next write. What DynamoDB
// answers from an index (a parent's children, a resource's buckets, every
// config) is a SCAN here, on every primary of a Cluster: its cost grows
// with the keyspace, as a DynamoDB Scan's does with the table. An Admin is
// safe for concurrent use; the client belongs to the caller.
type Admin struct {
	client  rueidis.Client
	keys    Keys
	now     func() int64
	scripts adminScripts
	// scanCount is the COUNT of a SCAN (scanCount); tests make it small
	// to walk many pages.
	scanCount int64
}

// NewAdmin returns an Admin on client for the deployment under keyPrefix
// (as the serving replicas use it; empty for DefaultPrefix). now is the
// clock in epoch milliseconds; nil is the wall clock. It does not call
// Redis.
func NewAdmin(client rueidis.Client, keyPrefix string, now func() int64) (*Admin, error) {
	if client == nil {
		return nil, errors.New("redis: no client")
	}
	keys, err := NewKeys(keyPrefix)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = func() int64 { return time.Now().UnixMilli() }
	}
	scripts := adminScripts{
		replaceHash: rueidis.NewLuaScript(replaceHashLua),
		take:        rueidis.NewLuaScript(takeLua),
		setApplied:  rueidis.NewLuaScript(setAppliedLua),
		putShare:    rueidis.NewLuaScript(putShareLua),
	}
	return &Admin{client: client, keys: keys, now: now, scripts: scripts, scanCount: scanCount}, nil
}

// Scripts that change one key as a whole, so that no reader (a replica
// deciding, another operator) sees a record half replaced. One key each:
// they run in a Cluster too.
const (
	// replaceHashLua replaces the hash KEYS[1] (a config record, a META)
	// with the field-value pairs ARGV[2:], expiring at ARGV[1] (epoch ms;
	// "0": never).
	replaceHashLua = `
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
if ARGV[1] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[1]) end
return 1`

	// takeLua deletes KEYS[1] and returns the hash it held.
	takeLua = `
local h = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return h`

	// setAppliedLua writes the applied set KEYS[1] (version ARGV[2],
	// records ARGV[3]) if its version is still ARGV[1] ("0": none yet),
	// and answers 1; else 0, writing nothing.
	setAppliedLua = `
local v = redis.call('HGET', KEYS[1], 'version')
if (v or '0') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'records', ARGV[3])
return 1`
)

// adminScripts are the Admin's scripts, each sent by EVALSHA (and EVAL
// once where the server does not know it yet).
type adminScripts struct {
	replaceHash, take, setApplied, putShare *rueidis.Lua
}

// configKey is the Redis key of the record k.
func (a *Admin) configKey(k backend.RecordKey) string {
	switch k.Level() {
	case backend.LevelEntity, backend.LevelEntityDefault:
		return a.keys.EntityConfig(k.Entity, k.Resource)
	case backend.LevelResource:
		return a.keys.ResourceConfig(k.Resource)
	}
	return a.keys.SystemConfig()
}

// checkConfig checks what PutConfig is asked to write, as the DynamoDB
// Admin does: a valid key, at least one limit, each valid and named once,
// and a sync window only on an entity config.
func checkConfig(k backend.RecordKey, limits []bucket.Limit, syncWindow time.Duration) error {
	if err := k.Valid(); err != nil {
		return err
	}
	if len(limits) == 0 {
		return fmt.Errorf("%s: a config needs at least one limit", k)
	}
	seen := map[string]bool{}
	for _, l := range limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if seen[l.Name] {
			return fmt.Errorf("%s: limit %q given twice", k, l.Name)
		}
		seen[l.Name] = true
	}
	if syncWindow > 0 && k.Entity == "" {
		return fmt.Errorf("%s: only entity configs are sync-written (--sync-window)", k)
	}
	return nil
}

// ceilSeconds turns epoch milliseconds into epoch seconds, rounding up,
// so that a ttl in seconds never ends before the time it stands for.
func ceilSeconds(ms int64) int64 { return (ms + 999) / 1000 }

// PutConfig writes the record k with limits, replacing what was there. A
// syncWindow > 0 writes a sync-written entity config (ADR-128): its ttl
// field and its key's expiry are now + 3 x syncWindow (to the second, up),
// and each rewrite sets them again; zero writes an operator config, which
// never expires.
func (a *Admin) PutConfig(ctx context.Context, k backend.RecordKey, limits []bucket.Limit, syncWindow time.Duration) (backend.Config, error) {
	if err := checkConfig(k, limits, syncWindow); err != nil {
		return backend.Config{}, err
	}
	var ttl int64
	fields := recordFields(limits)
	if k.Entity != "" {
		fields = append(fields, fieldEntity, k.Entity)
	}
	if k.Resource != "" {
		fields = append(fields, fieldResource, k.Resource)
	}
	expireAt := "0"
	if syncWindow > 0 {
		ttl = ceilSeconds(a.now() + 3*syncWindow.Milliseconds())
		fields = append(fields, fieldTTL, strconv.FormatInt(ttl, 10))
		expireAt = strconv.FormatInt(ttl*1000, 10)
	}
	args := append([]string{expireAt}, fields...)
	if err := a.scripts.replaceHash.Exec(ctx, a.client, []string{a.configKey(k)}, args).Error(); err != nil {
		return backend.Config{}, fmt.Errorf("writing %s: %w", k, err)
	}
	return backend.Config{Key: k, Limits: limits, TTL: ttl}, nil
}

// GetConfig reads the record k. A sync-written config whose ttl has
// passed is absent, as it is for decisions.
func (a *Admin) GetConfig(ctx context.Context, k backend.RecordKey) (backend.Config, bool, error) {
	if err := k.Valid(); err != nil {
		return backend.Config{}, false, err
	}
	h, err := a.client.Do(ctx, a.client.B().Hgetall().Key(a.configKey(k)).Build()).AsStrMap()
	if err != nil {
		return backend.Config{}, false, fmt.Errorf("reading %s: %w", k, err)
	}
	c, ok, err := decodeConfig(h, a.now())
	if err != nil {
		return backend.Config{}, false, fmt.Errorf("%s: %w", k, err)
	}
	c.Key = k
	return c, ok, nil
}

// GetConfigs reads the records keys name, pipelined (in a Cluster, one
// pipeline per node that holds any). The answer holds the records that
// exist; a sync-written one past its ttl does not.
func (a *Admin) GetConfigs(ctx context.Context, keys []backend.RecordKey) (map[backend.RecordKey]backend.Config, error) {
	var uniq []backend.RecordKey
	seen := map[backend.RecordKey]bool{}
	for _, k := range keys {
		if err := k.Valid(); err != nil {
			return nil, err
		}
		if !seen[k] {
			seen[k] = true
			uniq = append(uniq, k)
		}
	}
	out := make(map[backend.RecordKey]backend.Config, len(uniq))
	for len(uniq) > 0 {
		batch := uniq[:min(len(uniq), maxPipeline)]
		uniq = uniq[len(batch):]
		cmds := make(rueidis.Commands, len(batch))
		for i, k := range batch {
			cmds[i] = a.client.B().Hgetall().Key(a.configKey(k)).Build()
		}
		now := a.now()
		for i, res := range a.client.DoMulti(ctx, cmds...) {
			k := batch[i]
			h, err := res.AsStrMap()
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", k, err)
			}
			c, ok, err := decodeConfig(h, now)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			if ok {
				c.Key = k
				out[k] = c
			}
		}
	}
	return out, nil
}

// DeleteConfig deletes the record k and reports whether it existed (a
// sync-written one past its ttl did not, as on DynamoDB).
func (a *Admin) DeleteConfig(ctx context.Context, k backend.RecordKey) (bool, error) {
	if err := k.Valid(); err != nil {
		return false, err
	}
	h, err := a.scripts.take.Exec(ctx, a.client, []string{a.configKey(k)}, nil).AsStrMap()
	if err != nil {
		return false, fmt.Errorf("deleting %s: %w", k, err)
	}
	_, existed, err := decodeConfig(h, a.now())
	if err != nil {
		// It is gone all the same; what it held does not matter now.
		return true, nil
	}
	return existed, nil
}

// decodeConfig reads a config hash. Its Key comes from the entity and
// resource fields PutConfig writes; the caller sets it where it knows
// better.
func decodeConfig(h map[string]string, nowMs int64) (backend.Config, bool, error) {
	rec, ok, err := decodeRecord(h, nowMs)
	if err != nil || !ok {
		return backend.Config{}, false, err
	}
	c := backend.Config{Key: backend.RecordKey{Entity: h[fieldEntity], Resource: h[fieldResource]}, Limits: rec.Limits}
	if v, ok := h[fieldTTL]; ok {
		c.TTL, _ = strconv.ParseInt(v, 10, 64) // decodeRecord checked it
	}
	return c, true, nil
}

// unseg is the name a key segment stands for, or the segment itself when
// it cannot be read back (a name past keyseg.MaxLen bytes is a hash).
func unseg(s string) string {
	name, _ := keyseg.Decode(s, reserved)
	return name
}

// globEscape quotes the bytes SCAN's MATCH reads as a pattern, so an
// encoded segment matches only itself.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// configKeyOf names the record a config key holds, from the key alone:
// the fallback for a hash without entity and resource fields.
func (a *Admin) configKeyOf(key string) (backend.RecordKey, bool) {
	rest, ok := strings.CutPrefix(key, a.keys.base()+":c:")
	if !ok {
		return backend.RecordKey{}, false
	}
	switch {
	case rest == "s":
		return backend.SystemKey(), true
	case strings.HasPrefix(rest, "r:"):
		return backend.ResourceKey(unseg(rest[2:])), true
	case strings.HasPrefix(rest, "e:"):
		e, r, ok := strings.Cut(rest[2:], ":")
		if !ok || strings.Contains(r, ":") {
			return backend.RecordKey{}, false
		}
		return backend.EntityKey(unseg(e), unseg(r)), true
	}
	return backend.RecordKey{}, false
}

// readConfigs reads the config hashes at keys (found by a SCAN) and calls
// fn for each that holds a record. A key gone since the SCAN is skipped.
func (a *Admin) readConfigs(ctx context.Context, keys []string, fn func(backend.Config) error) error {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = a.client.B().Hgetall().Key(k).Build()
	}
	now := a.now()
	for i, res := range a.client.DoMulti(ctx, cmds...) {
		h, err := res.AsStrMap()
		if err != nil {
			return fmt.Errorf("reading %s: %w", keys[i], err)
		}
		c, ok, err := decodeConfig(h, now)
		if err != nil {
			return fmt.Errorf("config %s: %w", keys[i], err)
		}
		if !ok {
			continue
		}
		if _, named := h[fieldResource]; !named {
			if c.Key, named = a.configKeyOf(keys[i]); !named {
				continue // not a config key of this layout
			}
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

// EntityConfigs lists the configs of entity, every resource, in the
// order of their resources.
func (a *Admin) EntityConfigs(ctx context.Context, entity string) ([]backend.Config, error) {
	var out []backend.Config
	pattern := a.keys.base() + ":c:e:" + globEscape(seg(entity)) + ":*"
	err := a.scan(ctx, pattern, func(keys []string) error {
		return a.readConfigs(ctx, keys, func(c backend.Config) error {
			out = append(out, c)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("configs of entity %q: %w", entity, err)
	}
	slices.SortFunc(out, func(x, y backend.Config) int { return strings.Compare(x.Key.Resource, y.Key.Resource) })
	return out, nil
}

// AllConfigs calls fn for every config record of the deployment, in no
// particular order. It SCANs the whole keyspace of every primary, so its
// cost grows with the number of keys, buckets included: meant for audits,
// not for a hot path.
func (a *Admin) AllConfigs(ctx context.Context, fn func(backend.Config) error) error {
	err := a.scan(ctx, a.keys.base()+":c:*", func(keys []string) error {
		return a.readConfigs(ctx, keys, fn)
	})
	if err != nil {
		return fmt.Errorf("scanning for configs: %w", err)
	}
	return nil
}

// primaries are the nodes that hold the keyspace: the one node of a
// standalone or Sentinel deployment, every primary of a Cluster (its
// replicas hold copies, which a listing must not count twice, and which
// may lag).
func (a *Admin) primaries(ctx context.Context) ([]rueidis.Client, error) {
	nodes := a.client.Nodes()
	if len(nodes) == 1 {
		for _, n := range nodes {
			return []rueidis.Client{n}, nil
		}
	}
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	slices.Sort(addrs)
	var out []rueidis.Client
	for _, addr := range addrs {
		n := nodes[addr]
		role, err := n.Do(ctx, n.B().Role().Build()).ToArray()
		if err != nil {
			return nil, fmt.Errorf("node %s: ROLE: %w", addr, err)
		}
		if len(role) == 0 {
			return nil, fmt.Errorf("node %s: ROLE answered nothing", addr)
		}
		if r, _ := role[0].ToString(); r == "master" {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none of %d nodes is a primary", len(nodes))
	}
	return out, nil
}

// scan calls fn with the keys matching pattern, a SCAN page at a time, on
// every primary, each key once (SCAN may return a key twice, and a key
// that moves between nodes during the walk may be on both). A key that
// exists from the start to the end of the walk is found; one written or
// deleted meanwhile may or may not be. fn's error stops the walk.
func (a *Admin) scan(ctx context.Context, pattern string, fn func(keys []string) error) error {
	nodes, err := a.primaries(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		var cursor uint64
		for {
			e, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match(pattern).Count(a.scanCount).Build()).AsScanEntry()
			if err != nil {
				return fmt.Errorf("SCAN %s: %w", pattern, err)
			}
			var fresh []string
			for _, k := range e.Elements {
				if !seen[k] {
					seen[k] = true
					fresh = append(fresh, k)
				}
			}
			if len(fresh) > 0 {
				if err := fn(fresh); err != nil {
					return err
				}
			}
			if e.Cursor == 0 {
				break
			}
			cursor = e.Cursor
		}
	}
	return nil
}

// Effective resolves the limits of entity's bucket for resource through
// the four levels, from Redis alone (the rule files' limits for the
// resource are not known here), reading every record afresh.
func (a *Admin) Effective(ctx context.Context, entity, resource string) (backend.Resolved, error) {
	return backend.Resolve(ctx, backend.ConfigRecords(a.GetConfig), entity, resource, nil)
}
