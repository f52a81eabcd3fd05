package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// newAdmin is an Admin on c whose SCANs walk pages of two keys, so that
// every listing crosses pages.
func newAdmin(t *testing.T, c rueidis.Client, prefix string, now func() int64) *Admin {
	t.Helper()
	a, err := NewAdmin(c, prefix, now)
	if err != nil {
		t.Fatal(err)
	}
	a.scanCount = 2
	return a
}

// wallClock is a fake clock that starts at the wall clock's time: keys
// the Admin expires at an absolute time (PEXPIREAT) must not be in the
// past for the real server.
func wallClock() *fakeClock {
	c := newFakeClock()
	c.ms.Store(time.Now().UnixMilli())
	return c
}

// parse turns limits in the command line's syntax into bucket.Limits.
func parse(t *testing.T, specs ...string) []bucket.Limit {
	t.Helper()
	out := make([]bucket.Limit, 0, len(specs))
	for _, s := range specs {
		l, err := bucket.ParseLimit(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// Config records at the four levels: written, read back, listed (all,
// and one entity's, exactly: not another's whose name starts the same
// or matches as a glob pattern, and a name too long for a key by its
// name), and deleted; a sync-written entity config carries its ttl and
// its key expires then, and once the clock passes it the record is
// absent even before Redis drops it.
func TestAdminConfigs(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	clk := wallClock()
	a := newAdmin(t, client, "", clk.now)
	ctx := t.Context()
	long := strings.Repeat("k", keysegMax+1)

	type put struct {
		k      backend.RecordKey
		limits []bucket.Limit
		sync   time.Duration
	}
	puts := []put{
		{backend.SystemKey(), parse(t, "rpm=1000/min"), 0},
		{backend.ResourceKey("chat"), parse(t, "rpm=20/min:cost=request", "tpm=40000/min:burst=60000"), 0},
		{backend.ResourceKey("x:y{z}"), parse(t, "rps=5/s"), 0},
		{backend.EntityKey("acme", backend.DefaultResource), parse(t, "rpm=500/min"), 0},
		{backend.EntityKey("acme", "chat"), parse(t, "rpm=50/min"), 0},
		{backend.EntityKey("acme2", "chat"), parse(t, "rpm=60/min"), 0},
		{backend.EntityKey("a*", "chat"), parse(t, "rpm=1/min"), 0},
		{backend.EntityKey("ab", "chat"), parse(t, "rpm=2/min"), 0},
		{backend.EntityKey(long, "chat"), parse(t, "rpm=3/min"), 0},
		{backend.EntityKey("trial-7", "chat"), parse(t, "rpm=10/min"), time.Hour},
	}
	for _, p := range puts {
		if _, ok, err := a.GetConfig(ctx, p.k); err != nil || ok {
			t.Fatalf("%s before any write: ok=%v, %v", p.k, ok, err)
		}
		c, err := a.PutConfig(ctx, p.k, p.limits, p.sync)
		if err != nil {
			t.Fatalf("PutConfig %s: %v", p.k, err)
		}
		wantTTL := int64(0)
		if p.sync > 0 {
			wantTTL = ceilSeconds(clk.now() + 3*time.Hour.Milliseconds())
		}
		if c.Key != p.k || !slices.Equal(c.Limits, p.limits) || c.TTL != wantTTL {
			t.Fatalf("PutConfig %s = %+v, want ttl %d", p.k, c, wantTTL)
		}
		got, ok, err := a.GetConfig(ctx, p.k)
		if err != nil || !ok || got.Key != p.k || got.TTL != wantTTL || !slices.EqualFunc(got.Limits, p.limits, sameLimit) {
			t.Fatalf("GetConfig %s = %+v, %v, %v; want %v", p.k, got, ok, err, p.limits)
		}
		// The key's own expiry is the ttl: none for an operator's config,
		// 3 h for a sync-written one.
		ms := pttl(t, srv, a.configKey(p.k))
		if p.sync == 0 && ms != -1 || p.sync > 0 && (ms <= 3*time.Hour.Milliseconds()-5000 || ms > 3*time.Hour.Milliseconds()+1000) {
			t.Errorf("%s: PTTL %d ms", p.k, ms)
		}
	}

	// Listing: every record, by its exact names.
	var all []backend.RecordKey
	if err := a.AllConfigs(ctx, func(c backend.Config) error {
		all = append(all, c.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var want []backend.RecordKey
	for _, p := range puts {
		want = append(want, p.k)
	}
	sortKeys := func(ks []backend.RecordKey) {
		slices.SortFunc(ks, func(x, y backend.RecordKey) int { return strings.Compare(x.String(), y.String()) })
	}
	sortKeys(all)
	sortKeys(want)
	if !slices.Equal(all, want) {
		t.Errorf("AllConfigs listed %v\nwant %v", all, want)
	}
	for _, c := range []struct {
		entity string
		want   []string // resources
	}{
		{"acme", []string{backend.DefaultResource, "chat"}},
		{"a*", []string{"chat"}},
		{long, []string{"chat"}},
		{"nobody", nil},
	} {
		cs, err := a.EntityConfigs(ctx, c.entity)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, cf := range cs {
			if cf.Key.Entity != c.entity {
				t.Errorf("EntityConfigs(%.20q) listed %s", c.entity, cf.Key)
			}
			got = append(got, cf.Key.Resource)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("EntityConfigs(%.20q) = %v, want %v", c.entity, got, c.want)
		}
	}

	// A record written by another tool, without the names in the clear,
	// is named from its key.
	putRecord(t, srv, Keys{}.EntityConfig("a:b{c}", "r"), parse(t, "rpm=7/min"))
	cs, err := a.EntityConfigs(ctx, "a:b{c}")
	if err != nil || len(cs) != 1 || cs[0].Key != backend.EntityKey("a:b{c}", "r") {
		t.Errorf("a record without names: %+v, %v", cs, err)
	}

	found, err := a.GetConfigs(ctx, append(want, backend.ResourceKey("missing"), backend.SystemKey()))
	if err != nil || len(found) != len(want) {
		t.Fatalf("GetConfigs: %d records, %v; want %d", len(found), err, len(want))
	}
	if found[backend.EntityKey("trial-7", "chat")].TTL == 0 {
		t.Error("GetConfigs lost the ttl of the sync-written config")
	}

	// Rewritten by an operator, the sync-written config no longer expires.
	trial := backend.EntityKey("trial-7", "chat")
	if _, err := a.PutConfig(ctx, trial, parse(t, "rpm=10/min"), 0); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := a.GetConfig(ctx, trial); got.TTL != 0 || pttl(t, srv, a.configKey(trial)) != -1 {
		t.Errorf("rewritten without a sync window: ttl %d, PTTL %d", got.TTL, pttl(t, srv, a.configKey(trial)))
	}
	if _, err := a.PutConfig(ctx, trial, parse(t, "rpm=10/min"), time.Minute); err != nil {
		t.Fatal(err)
	}
	// Past its ttl it is gone for the Admin as for decisions, before
	// Redis drops the key; deleting it then finds nothing.
	clk.advance(3*time.Minute.Milliseconds() + 1000)
	if _, ok, err := a.GetConfig(ctx, trial); err != nil || ok {
		t.Errorf("past its ttl: ok=%v, %v", ok, err)
	}
	if r, err := a.Effective(ctx, "trial-7", "chat"); err != nil || r.Level != backend.LevelResource {
		t.Errorf("Effective past the ttl: %+v, %v", r, err)
	}
	if existed, err := a.DeleteConfig(ctx, trial); err != nil || existed {
		t.Errorf("deleting it past its ttl: existed=%v, %v", existed, err)
	}

	// Delete: once, then it is not there.
	for _, k := range []backend.RecordKey{backend.SystemKey(), backend.EntityKey(long, "chat")} {
		if existed, err := a.DeleteConfig(ctx, k); err != nil || !existed {
			t.Errorf("DeleteConfig %s: existed=%v, %v", k, existed, err)
		}
		if existed, err := a.DeleteConfig(ctx, k); err != nil || existed {
			t.Errorf("DeleteConfig %s again: existed=%v, %v", k, existed, err)
		}
	}

	// What the DynamoDB Admin refuses, this one refuses.
	for _, bad := range []struct {
		k      backend.RecordKey
		limits []bucket.Limit
		sync   time.Duration
	}{
		{backend.SystemKey(), nil, 0},
		{backend.SystemKey(), parse(t, "rpm=1/s", "rpm=2/s"), 0},
		{backend.ResourceKey("chat"), parse(t, "rpm=1/s"), time.Hour},
		{backend.RecordKey{Entity: "e"}, parse(t, "rpm=1/s"), 0},
	} {
		if _, err := a.PutConfig(ctx, bad.k, bad.limits, bad.sync); err == nil {
			t.Errorf("PutConfig %s %v sync %v: no error", bad.k, bad.limits, bad.sync)
		}
	}

	// Another deployment's prefix sees none of it.
	other := newAdmin(t, client, "dep2", clk.now)
	if err := other.AllConfigs(ctx, func(c backend.Config) error {
		t.Errorf("prefix dep2 lists %s", c.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// keysegMax is keyseg.MaxLen: a name longer than that is a hash in keys.
const keysegMax = 512

// sameLimit compares limits as a record stores them.
func sameLimit(x, y bucket.Limit) bool { return x == y }

// What an Admin writes is what the serving backend decides on: limits
// at each level, the level reported, and the bucket TTL a sync-written
// config gives (ADR-128) against an operator's (none).
func TestAdminConfigsDecide(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	clk := wallClock()
	a := newAdmin(t, client, "dep", clk.now)
	ctx := t.Context()
	put := func(k backend.RecordKey, sync time.Duration, specs ...string) []bucket.Limit {
		t.Helper()
		c, err := a.PutConfig(ctx, k, parse(t, specs...), sync)
		if err != nil {
			t.Fatal(err)
		}
		return c.Limits
	}
	sys := put(backend.SystemKey(), 0, "rpm=1000/min")
	res := put(backend.ResourceKey("chat"), 0, "rpm=20/min:cost=request", "tpm=40000/min:burst=60000")
	wide := put(backend.EntityKey("acme", backend.DefaultResource), 0, "rpm=500/min")
	own := put(backend.EntityKey("acme", "chat"), 0, "rpm=2/min")
	synced := put(backend.EntityKey("trial", "chat"), time.Hour, "rpm=3/min")

	b := newBackend(t, client, Options{KeyPrefix: "dep", TTLMultiplier: 7, Now: clk.now})
	for _, c := range []struct {
		entity, resource string
		limits           []bucket.Limit
		level            backend.Level
		expires          bool
	}{
		{"acme", "chat", own, backend.LevelEntity, false},
		{"acme", "embed", wide, backend.LevelEntityDefault, true},
		{"zed", "chat", res, backend.LevelResource, true},
		{"zed", "embed", sys, backend.LevelSystem, true},
		{"trial", "chat", synced, backend.LevelEntity, true},
	} {
		d, err := b.Decide(ctx, &backend.Request{Entity: c.entity, Resource: c.resource, Hits: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Level != c.level || !slices.EqualFunc(d.Limits, sortedByName(c.limits), sameLimit) {
			t.Errorf("%s/%s: %+v; want level %v, limits %v", c.entity, c.resource, d, c.level, c.limits)
		}
		if ms := pttl(t, srv, b.keys.Bucket(c.entity, c.resource, "")); (ms > 0) != c.expires {
			t.Errorf("%s/%s: bucket PTTL %d ms, want expiry %v", c.entity, c.resource, ms, c.expires)
		}
		r, err := a.Effective(ctx, c.entity, c.resource)
		if err != nil || r.Level != c.level || bucket.Fingerprint(r.Limits) != bucket.Fingerprint(d.Limits) {
			t.Errorf("Effective %s/%s = %+v, %v; the backend decided on %v at %v", c.entity, c.resource, r, err, d.Limits, d.Level)
		}
	}
	// acme's own 2 a minute are spent: the third request is denied.
	for i, want := range []bool{true, false} {
		d, err := b.Decide(ctx, &backend.Request{Entity: "acme", Resource: "chat", Hits: 1})
		if err != nil || d.Allowed != want {
			t.Fatalf("acme request %d: allowed %v, %v; want %v", i+2, d.Allowed, err, want)
		}
	}
}

// sortedByName is limits in the order a stored record reads back in.
func sortedByName(ls []bucket.Limit) []bucket.Limit {
	out := slices.Clone(ls)
	slices.SortFunc(out, func(x, y bucket.Limit) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// Entities: META written, read, listed by parent (sorted, exactly that
// parent's), refused when malformed; deleting one removes its META,
// configs and buckets (under its own hash tag and under its parent's),
// and nothing of another entity, not one whose name starts the same nor
// one its name matches as a glob pattern, nor its children's buckets
// tagged by it.
func TestAdminEntities(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	clk := wallClock()
	a := newAdmin(t, client, "", clk.now)
	ctx := t.Context()
	long := strings.Repeat("p", keysegMax+1)
	for _, e := range []backend.Entity{
		{Name: "key-2", Parent: "team-a", Cascade: true},
		{Name: "key-1", Parent: "team-a", Cascade: true},
		{Name: "key-3", Parent: "team-b"},
		{Name: "team-a"},
		{Name: "x:y{z}", Parent: "team-a"},
		{Name: long, Parent: "team-a", Cascade: true},
	} {
		if err := a.PutEntity(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok, err := a.GetEntity(ctx, "key-1"); err != nil || !ok || got != (backend.Entity{Name: "key-1", Parent: "team-a", Cascade: true}) {
		t.Errorf("GetEntity key-1 = %+v, %v, %v", got, ok, err)
	}
	if _, ok, err := a.GetEntity(ctx, "nobody"); err != nil || ok {
		t.Errorf("GetEntity nobody: ok=%v, %v", ok, err)
	}
	var kids []string
	if err := a.Children(ctx, "team-a", func(e backend.Entity) error {
		kids = append(kids, e.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"key-1", "key-2", long, "x:y{z}"}; !slices.Equal(kids, want) {
		t.Errorf("children of team-a: %.40q, want %.40q", kids, want)
	}
	stop := errors.New("stop")
	calls := 0
	if err := a.Children(ctx, "team-a", func(backend.Entity) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Errorf("a stopped walk: %v after %d calls", err, calls)
	}
	for _, bad := range []backend.Entity{{Name: ""}, {Name: "a", Parent: "a"}, {Name: "a", Cascade: true}} {
		if err := a.PutEntity(ctx, bad); err == nil {
			t.Errorf("PutEntity %+v: no error", bad)
		}
	}
	// No parent any more: the META says so.
	if err := a.PutEntity(ctx, backend.Entity{Name: "key-3"}); err != nil {
		t.Fatal(err)
	}
	if got, ok, _ := a.GetEntity(ctx, "key-3"); !ok || got.Parent != "" || got.Cascade {
		t.Errorf("key-3 after losing its parent: %+v", got)
	}

	// acme has configs and buckets, acme's child kid has a bucket tagged
	// by acme, and acme2, a* and ab have theirs.
	if err := a.PutEntity(ctx, backend.Entity{Name: "kid", Parent: "acme", Cascade: true}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"acme", "acme2", "a*", "ab", "kid"} {
		for _, r := range []string{backend.DefaultResource, "chat"} {
			if _, err := a.PutConfig(ctx, backend.EntityKey(e, r), parse(t, "rpm=100/min"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := a.PutEntity(ctx, backend.Entity{Name: "acme", Parent: "org"}); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, client, Options{TTLMultiplier: 7, Now: clk.now})
	for _, req := range []backend.Request{
		{Entity: "acme", Resource: "chat"}, {Entity: "acme", Resource: "embed"},
		{Entity: "acme", Resource: "chat", Parent: "boss"}, // tagged by boss
		{Entity: "kid", Resource: "chat"},                  // kid's and acme's, tagged by acme
		{Entity: "acme2", Resource: "chat"}, {Entity: "a*", Resource: "chat"}, {Entity: "ab", Resource: "chat"},
	} {
		req.Hits = 1
		if _, err := b.Decide(ctx, &req); err != nil {
			t.Fatal(err)
		}
	}
	keys := Keys{}
	kidBucket := keys.Bucket("kid", "chat", "acme")
	for _, k := range []string{keys.Bucket("acme", "chat", ""), keys.Bucket("acme", "chat", "boss"), kidBucket} {
		if n, _ := srv.Do(ctx, "EXISTS", k); n != "1" {
			t.Fatalf("%s was not written", k)
		}
	}
	before, err := srvInt(t, srv, "DBSIZE")
	if err != nil {
		t.Fatal(err)
	}

	// META, 2 configs, 3 buckets (chat, embed, chat tagged by boss).
	if n, err := a.DeleteEntity(ctx, "acme"); err != nil || n != 6 {
		t.Errorf("DeleteEntity acme: %d keys, %v; want 6", n, err)
	}
	if n, err := a.DeleteEntity(ctx, "a*"); err != nil || n != 3 {
		t.Errorf("DeleteEntity a*: %d keys, %v; want 3 (2 configs, 1 bucket)", n, err)
	}
	if n, err := a.DeleteEntity(ctx, "acme"); err != nil || n != 0 {
		t.Errorf("DeleteEntity acme again: %d, %v", n, err)
	}
	if after, err := srvInt(t, srv, "DBSIZE"); err != nil || after != before-9 {
		t.Errorf("%d keys before, %d after deleting 9 (%v)", before, after, err)
	}
	for _, k := range []string{kidBucket, keys.Bucket("acme2", "chat", ""), keys.Bucket("ab", "chat", ""),
		keys.EntityConfig("acme2", "chat"), keys.EntityConfig("ab", backend.DefaultResource), keys.Meta("kid")} {
		if n, _ := srv.Do(ctx, "EXISTS", k); n != "1" {
			t.Errorf("%s went with another entity", k)
		}
	}
}

// srvInt is the integer reply of a command.
func srvInt(t *testing.T, srv *redistest.Server, args ...string) (int64, error) {
	t.Helper()
	s, err := srv.Do(context.Background(), args...)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// Buckets as decisions leave them: read back whatever their hash tag (the
// entity's own, a cascade parent's from the METAs three deep, a parent a
// rule named, which only a SCAN finds), with the tokens, clocks and
// consumption the decisions reported, the fingerprint of their limits
// and their expiry; listed by resource; audited.
func TestAdminBuckets(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	clk := wallClock()
	a := newAdmin(t, client, "", clk.now)
	ctx := t.Context()
	for _, k := range []backend.RecordKey{backend.ResourceKey("chat"), backend.EntityKey("org", "chat")} {
		if _, err := a.PutConfig(ctx, k, parse(t, "rpm=10/min", "tpm=1000/min:burst=1500"), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []backend.Entity{{Name: "user", Parent: "team", Cascade: true}, {Name: "team", Parent: "org", Cascade: true}} {
		if err := a.PutEntity(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	b := newBackend(t, client, Options{TTLMultiplier: 7, Now: clk.now})
	decide := func(entity, parent string, hits uint64) {
		t.Helper()
		d, err := b.Decide(ctx, &backend.Request{Entity: entity, Parent: parent, Resource: "chat", Hits: hits})
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", entity, d, err)
		}
	}
	decide("solo", "", 3)
	clk.advance(1500)
	decide("user", "", 2) // user, tagged by org, and team
	decide("ruled", "boss", 4)

	// The METAs give the tag the serving backend used, without a SCAN.
	for e, want := range map[string]string{"user": "org", "team": "org", "org": "org", "solo": "solo", "ruled": "ruled"} {
		if got, err := a.top(ctx, e); err != nil || got != want {
			t.Errorf("top of %s: %q, %v; want %q", e, got, err, want)
		}
	}
	keys := Keys{}
	for _, k := range []string{keys.Bucket("user", "chat", "org"), keys.Bucket("team", "chat", "org"), keys.Bucket("ruled", "chat", "boss")} {
		if n, _ := srv.Do(ctx, "EXISTS", k); n != "1" {
			t.Fatalf("%s was not written", k)
		}
	}
	fp := bucket.Fingerprint(sortedByName(parse(t, "rpm=10/min", "tpm=1000/min:burst=1500")))
	for _, c := range []struct {
		entity   string
		consumed int64 // millitokens of each limit
		expires  bool
	}{
		{"solo", 3000, true},
		{"user", 2000, true},
		{"team", 2000, true},
		{"ruled", 4000, true},
		{"boss", 4000, true},
		{"org", 0, false},
	} {
		got, ok, err := a.GetBucket(ctx, c.entity, "chat")
		if c.consumed == 0 {
			if err != nil || ok {
				t.Errorf("GetBucket %s: ok=%v, %v; it holds no bucket", c.entity, ok, err)
			}
			continue
		}
		if err != nil || !ok {
			t.Errorf("GetBucket %s: ok=%v, %v", c.entity, ok, err)
			continue
		}
		if got.Entity != c.entity || got.Resource != "chat" || got.Cfg != fp || len(got.Limits) != 2 || got.Limits[0].Name != "rpm" {
			t.Errorf("GetBucket %s = %+v", c.entity, got)
			continue
		}
		for i, s := range got.States {
			if s.Consumed != c.consumed || s.Tokens != got.Limits[i].Burst-c.consumed || s.Clock <= 0 || s.Clock > clk.now() {
				t.Errorf("%s limit %s: %+v after consuming %d", c.entity, got.Limits[i].Name, s, c.consumed)
			}
		}
		// Seven times the slowest fill (1500 tokens at 1000 a minute).
		want := ceilSeconds(clk.now() + 7*90_000)
		if got.TTL < want-5 || got.TTL > want+1 {
			t.Errorf("%s: ttl %d, want about %d", c.entity, got.TTL, want)
		}
		if v := got.Violations(clk.now(), 0); len(v) > 0 {
			t.Errorf("%s: %v", c.entity, v)
		}
	}
	if _, ok, err := a.GetBucket(ctx, "solo", "embed"); err != nil || ok {
		t.Errorf("a bucket never used: ok=%v, %v", ok, err)
	}

	// Listing: every entity holding a bucket for chat, once, with the
	// fingerprint; not another resource's.
	decide("solo", "", 1)
	if _, err := b.Decide(ctx, &backend.Request{Entity: "solo", Resource: "chat2", Hits: 1,
		Defaults: parse(t, "rps=1/s")}); err != nil {
		t.Fatal(err)
	}
	var listed []string
	if err := a.Buckets(ctx, "chat", func(r backend.BucketRef) error {
		if r.Resource != "chat" || r.Cfg != fp {
			t.Errorf("listed %+v", r)
		}
		listed = append(listed, r.Entity)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	if want := []string{"boss", "ruled", "solo", "team", "user"}; !slices.Equal(listed, want) {
		t.Errorf("buckets of chat: %v, want %v", listed, want)
	}
	stop := errors.New("stop")
	calls := 0
	if err := a.Buckets(ctx, "chat", func(backend.BucketRef) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Errorf("a stopped listing: %v after %d calls", err, calls)
	}

	// The audit: every bucket, each keeping the invariants.
	n := 0
	if err := a.AllBuckets(ctx, func(bk backend.Bucket) error {
		n++
		if v := bk.Violations(clk.now(), 0); len(v) > 0 {
			t.Errorf("%v", v)
		}
		return nil
	}); err != nil || n != 6 {
		t.Errorf("AllBuckets: %d buckets, %v; want 6", n, err)
	}
}

// The applied set of `sluice limits apply`: empty at first (version 0),
// then what the last apply wrote; an apply that read an older version
// fails with ErrAppliedChanged and writes nothing.
func TestAdminApplied(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	a := newAdmin(t, client, "", nil)
	ctx := t.Context()
	refs, v, err := a.Applied(ctx)
	if err != nil || len(refs) != 0 || v != 0 {
		t.Fatalf("before any apply: %v, %d, %v", refs, v, err)
	}
	first := []backend.RecordKey{backend.SystemKey(), backend.ResourceKey("chat"), backend.EntityKey("a:b", backend.DefaultResource)}
	if err := a.SetApplied(ctx, first, 0); err != nil {
		t.Fatal(err)
	}
	// A second apply that also read version 0 lost the race.
	if err := a.SetApplied(ctx, nil, 0); !errors.Is(err, backend.ErrAppliedChanged) {
		t.Fatalf("racing apply: %v, want ErrAppliedChanged", err)
	}
	refs, v, err = a.Applied(ctx)
	if err != nil || v != 1 || !slices.Equal(refs, first) {
		t.Fatalf("after the first apply: %v, %d, %v", refs, v, err)
	}
	second := []backend.RecordKey{backend.EntityKey("acme", "chat")}
	if err := a.SetApplied(ctx, second, 1); err != nil {
		t.Fatal(err)
	}
	if err := a.SetApplied(ctx, first, 1); !errors.Is(err, backend.ErrAppliedChanged) {
		t.Fatalf("stale apply: %v, want ErrAppliedChanged", err)
	}
	if refs, v, err = a.Applied(ctx); err != nil || v != 2 || !slices.Equal(refs, second) {
		t.Fatalf("after the second apply: %v, %d, %v", refs, v, err)
	}
	if err := a.SetApplied(ctx, nil, 2); err != nil {
		t.Fatal(err)
	}
	if refs, v, err = a.Applied(ctx); err != nil || v != 3 || len(refs) != 0 {
		t.Fatalf("after an empty apply: %v, %d, %v", refs, v, err)
	}
}

// On a Redis Cluster of three primaries the listings SCAN every primary
// and find every key once, whichever node holds it; the rest reads and
// writes through the client, which routes each key to its node.
func TestAdminOnACluster(t *testing.T) {
	cluster := redistest.RequireCluster(t, 3)
	client, err := Dial(t.Context(), Conn{URL: cluster.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	clk := wallClock()
	a := newAdmin(t, client, "", clk.now)
	ctx := t.Context()
	if _, err := a.PutConfig(ctx, backend.ResourceKey("chat"), parse(t, "rpm=10/min"), 0); err != nil {
		t.Fatal(err)
	}
	var names, kids []string
	for i := range 20 {
		e := "e" + strconv.Itoa(i)
		names = append(names, e)
		if _, err := a.PutConfig(ctx, backend.EntityKey(e, "chat"), parse(t, "rpm=5/min"), 0); err != nil {
			t.Fatal(err)
		}
		if err := a.PutEntity(ctx, backend.Entity{Name: e, Parent: "org", Cascade: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
		kids = append(kids, e)
	}
	for _, n := range cluster.Nodes {
		if size, err := srvInt(t, n, "DBSIZE"); err != nil || size == 0 {
			t.Fatalf("node %s holds %d keys (%v): the test spreads too little", n.Addr(), size, err)
		}
	}

	count := 0
	if err := a.AllConfigs(ctx, func(backend.Config) error { count++; return nil }); err != nil || count != 21 {
		t.Errorf("AllConfigs: %d records, %v; want 21", count, err)
	}
	var got []string
	if err := a.Children(ctx, "org", func(e backend.Entity) error {
		got = append(got, e.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(kids)
	if !slices.Equal(got, kids) {
		t.Errorf("children of org: %v, want %v", got, kids)
	}

	b := newBackend(t, client, Options{TTLMultiplier: 7, Now: clk.now})
	for _, e := range names {
		if _, err := b.Decide(ctx, &backend.Request{Entity: e, Resource: "chat", Hits: 1}); err != nil {
			t.Fatal(err)
		}
	}
	got = nil
	if err := a.Buckets(ctx, "chat", func(r backend.BucketRef) error {
		got = append(got, r.Entity)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := append(slices.Clone(names), "org")
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("buckets of chat: %v, want %v", got, want)
	}
	if bk, ok, err := a.GetBucket(ctx, "e0", "chat"); err != nil || !ok || bk.States[0].Consumed != 1000 {
		t.Errorf("GetBucket e0 (tagged by org): %+v, %v, %v", bk, ok, err)
	}
	if bk, ok, err := a.GetBucket(ctx, "org", "chat"); err != nil || !ok || bk.States[0].Consumed != 10_000 {
		t.Errorf("GetBucket org (charged by its 10 cascading children): %+v, %v, %v", bk, ok, err)
	}
	if n, err := a.DeleteEntity(ctx, "e1"); err != nil || n != 3 {
		t.Errorf("DeleteEntity e1: %d keys, %v; want 3", n, err)
	}
	if err := a.SetApplied(ctx, []backend.RecordKey{backend.ResourceKey("chat")}, 0); err != nil {
		t.Fatal(err)
	}
	if refs, v, err := a.Applied(ctx); err != nil || v != 1 || len(refs) != 1 {
		t.Errorf("Applied: %v, %d, %v", refs, v, err)
	}
}
