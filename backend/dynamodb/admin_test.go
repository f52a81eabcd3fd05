package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

func (e *env) admin(t *testing.T, prefix string, api ...AdminAPI) *Admin {
	t.Helper()
	var a AdminAPI = e.client
	if len(api) > 0 {
		a = api[0]
	}
	ad, err := NewAdmin(a, e.table, prefix, e.clock.now)
	if err != nil {
		t.Fatal(err)
	}
	return ad
}

func TestAdminConfigsAtEveryLevel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	ctx := t.Context()
	rpm := lim(t, "rpm", "100/min", -1)
	tpm := lim(t, "tpm", "1000/min", 1500)

	keys := []backend.RecordKey{
		backend.SystemKey(), backend.ResourceKey("chat"),
		backend.EntityKey("acme", backend.DefaultResource), backend.EntityKey("acme", "chat"),
	}
	for i, k := range keys {
		if _, ok, err := a.GetConfig(ctx, k); err != nil || ok {
			t.Fatalf("%s before any write: ok=%v, %v", k, ok, err)
		}
		limits := []bucket.Limit{rpm, tpm}[:1+i%2]
		c, err := a.PutConfig(ctx, k, limits, 0)
		if err != nil || c.TTL != 0 {
			t.Fatalf("PutConfig %s: %+v, %v", k, c, err)
		}
		got, ok, err := a.GetConfig(ctx, k)
		if err != nil || !ok || got.Key != k || !slices.Equal(got.Limits, limits) || got.TTL != 0 {
			t.Fatalf("GetConfig %s = %+v, %v, %v; want %v", k, got, ok, err, limits)
		}
	}

	// Effective: the first level with limits wins, and says which.
	for _, step := range []struct {
		del  backend.RecordKey
		want backend.Level
	}{
		{backend.RecordKey{Entity: "-"}, backend.LevelEntity}, // nothing deleted yet
		{backend.EntityKey("acme", "chat"), backend.LevelEntityDefault},
		{backend.EntityKey("acme", backend.DefaultResource), backend.LevelResource},
		{backend.ResourceKey("chat"), backend.LevelSystem},
		{backend.SystemKey(), backend.LevelNone},
	} {
		if step.del.Entity != "-" {
			existed, err := a.DeleteConfig(ctx, step.del)
			if err != nil || !existed {
				t.Fatalf("DeleteConfig %s: existed=%v, %v", step.del, existed, err)
			}
		}
		r, err := a.Effective(ctx, "acme", "chat")
		if err != nil || r.Level != step.want {
			t.Fatalf("after deleting %s: level %v, %v; want %v", step.del, r.Level, err, step.want)
		}
	}
	if existed, err := a.DeleteConfig(ctx, backend.SystemKey()); err != nil || existed {
		t.Errorf("deleting a missing record: existed=%v, %v", existed, err)
	}

	// What cannot be stored is refused before any write.
	for _, bad := range []struct {
		k      backend.RecordKey
		limits []bucket.Limit
		sync   time.Duration
	}{
		{backend.RecordKey{Entity: "acme"}, []bucket.Limit{rpm}, 0},     // no resource
		{backend.ResourceKey("chat"), nil, 0},                           // no limits
		{backend.ResourceKey("chat"), []bucket.Limit{rpm, rpm}, 0},      // twice
		{backend.ResourceKey("chat"), []bucket.Limit{rpm}, time.Minute}, // sync is for entities
		{backend.ResourceKey("chat"), []bucket.Limit{{Name: "x", Amount: 1, Period: 0}}, 0},
	} {
		if _, err := a.PutConfig(ctx, bad.k, bad.limits, bad.sync); err == nil {
			t.Errorf("PutConfig(%s, %v, %v) succeeded", bad.k, bad.limits, bad.sync)
		}
	}
}

// ADR-128: a sync-written config carries ttl = now + 3 x window, and once
// that has passed it is gone for the Admin as for decisions.
func TestAdminSyncWrittenConfigExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	ctx := t.Context()
	k := backend.EntityKey("job-7", "export")
	now := e.clock.now()
	c, err := a.PutConfig(ctx, k, []bucket.Limit{lim(t, "rpm", "10/min", -1)}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := ceilSeconds(now + 30*bucket.Minute); c.TTL != want {
		t.Errorf("ttl %d, want %d (now + 3 x 10 min)", c.TTL, want)
	}
	item := e.rawItem(t, a.keys.EntityPK("job-7"), a.keys.ConfigSK("export"))
	if attrN(t, item, attrTTL) != c.TTL {
		t.Errorf("stored ttl %d, want %d", attrN(t, item, attrTTL), c.TTL)
	}
	if r, err := a.Effective(ctx, "job-7", "export"); err != nil || r.Level != backend.LevelEntity || !r.Synced {
		t.Errorf("effective %+v, %v; want a synced entity config", r, err)
	}
	e.clock.advance(30*bucket.Minute + bucket.Second)
	if _, ok, err := a.GetConfig(ctx, k); err != nil || ok {
		t.Errorf("after its ttl: ok=%v, %v; want absent", ok, err)
	}
	if cs, err := a.EntityConfigs(ctx, "job-7"); err != nil || len(cs) != 0 {
		t.Errorf("EntityConfigs after its ttl: %v, %v", cs, err)
	}
}

// A change written by the Admin reaches a running replica within its
// config cache TTL, and the bucket takes it on its next write.
func TestAdminChangeReachesDecisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	// The cache's TTL runs on the wall clock: a second is short enough
	// for the test and long enough for the decision after the change to
	// come within it on a busy machine (100 ms was not, beside two busy
	// loops).
	const ttl = time.Second
	b := e.replica(t, Options{ConfigCacheTTL: ttl})
	ctx := t.Context()
	req := backend.Request{Entity: "acme", Resource: "chat", Hits: 1, Defaults: []bucket.Limit{lim(t, "rpm", "10/min", -1)}}

	d := mustDecide(t, b, req)
	start := time.Now() // the records were cached before this
	if d.Level != backend.LevelResource || d.Results[0].Tokens != 9000 {
		t.Fatalf("first decision: level %v tokens %d", d.Level, d.Results[0].Tokens)
	}
	if _, err := a.PutConfig(ctx, backend.EntityKey("acme", "chat"), []bucket.Limit{lim(t, "rpm", "100/min", -1)}, 0); err != nil {
		t.Fatal(err)
	}
	if d = mustDecide(t, b, req); d.Level != backend.LevelResource {
		t.Fatalf("within the cache TTL (%v after the first decision): level %v, want the cached resource level", time.Since(start), d.Level)
	}
	time.Sleep(time.Until(start.Add(ttl + 100*time.Millisecond))) // past the cache TTL
	d = mustDecide(t, b, req)
	if d.Level != backend.LevelEntity || d.Limits[0].Burst != 100_000 {
		t.Fatalf("after the change: level %v limits %v", d.Level, d.Limits)
	}
	bk, ok, err := a.GetBucket(ctx, "acme", "chat")
	if err != nil || !ok || bk.Cfg != bucket.Fingerprint(d.Limits) || bk.TTL != 0 {
		t.Fatalf("bucket %+v, %v, %v: want the new fingerprint and no ttl", bk, ok, err)
	}
}

func TestAdminEntities(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	a.pageSize = 2 // walk several pages
	b := e.replica(t, Options{})
	ctx := t.Context()

	for i := range 5 {
		if err := a.PutEntity(ctx, backend.Entity{Name: fmt.Sprintf("key-%d", i), Parent: "org#1", Cascade: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.PutEntity(ctx, backend.Entity{Name: "other", Parent: "org#2"}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := a.GetEntity(ctx, "key-2")
	if err != nil || !ok || got != (backend.Entity{Name: "key-2", Parent: "org#1", Cascade: true}) {
		t.Errorf("GetEntity = %+v, %v, %v", got, ok, err)
	}
	var children []string
	if err := a.Children(ctx, "org#1", func(c backend.Entity) error {
		children = append(children, c.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(children)
	if want := []string{"key-0", "key-1", "key-2", "key-3", "key-4"}; !slices.Equal(children, want) {
		t.Errorf("children %v, want %v", children, want)
	}
	for _, bad := range []backend.Entity{{Name: ""}, {Name: "a", Parent: "a"}, {Name: "a", Cascade: true}} {
		if err := a.PutEntity(ctx, bad); err == nil {
			t.Errorf("PutEntity(%+v) succeeded", bad)
		}
	}

	// An entity with META, two configs and 60 buckets: more than two
	// batches of 25, and more than one page.
	if _, err := a.PutConfig(ctx, backend.EntityKey("key-1", backend.DefaultResource), []bucket.Limit{lim(t, "rpm", "100/min", -1)}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutConfig(ctx, backend.EntityKey("key-1", "r0"), []bucket.Limit{lim(t, "rpm", "5/min", -1)}, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		mustDecide(t, b, backend.Request{Entity: "key-1", Resource: fmt.Sprintf("r%d", i), Hits: 1})
	}
	mustDecide(t, b, backend.Request{Entity: "key-2", Resource: "r0", Hits: 1, Defaults: []bucket.Limit{lim(t, "rpm", "5/min", -1)}})

	// Only buckets deleted in one batch are left unprocessed by the
	// faulty API; the Admin must ask again until all are gone.
	fa := e.admin(t, "", &halfBatches{AdminAPI: e.client})
	n, err := fa.DeleteEntity(ctx, "key-1")
	if err != nil || n != 63 {
		t.Fatalf("DeleteEntity = %d, %v; want 63 items (META, 2 configs, 60 buckets)", n, err)
	}
	for _, k := range []string{MetaSK(), a.keys.ConfigSK(backend.DefaultResource), a.keys.BucketSK("r59")} {
		if item := e.rawItem(t, a.keys.EntityPK("key-1"), k); len(item) != 0 {
			t.Errorf("%s survived the delete", k)
		}
	}
	if _, ok, _ := a.GetBucket(ctx, "key-2", "r0"); !ok {
		t.Error("another entity's bucket went with it")
	}
	if n, err := a.DeleteEntity(ctx, "nobody"); err != nil || n != 0 {
		t.Errorf("DeleteEntity(nobody) = %d, %v", n, err)
	}
}

// halfBatches is DynamoDB that processes only the first half of every
// BatchWriteItem and hands the rest back as unprocessed, as it does under
// throttling.
type halfBatches struct{ AdminAPI }

func (h *halfBatches) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	out := &dynamodb.BatchWriteItemOutput{UnprocessedItems: map[string][]types.WriteRequest{}}
	do := map[string][]types.WriteRequest{}
	for table, reqs := range in.RequestItems {
		k := (len(reqs) + 1) / 2
		do[table] = reqs[:k]
		if len(reqs[k:]) > 0 {
			out.UnprocessedItems[table] = reqs[k:]
		}
	}
	if _, err := h.AdminAPI.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: do}, o...); err != nil {
		return nil, err
	}
	return out, nil
}

func TestAdminBuckets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	a.pageSize = 3
	b := e.replica(t, Options{LeaseHorizon: -1}) // exact token counts
	ctx := t.Context()
	rpm := lim(t, "rpm", "60/min", -1)
	for i := range 7 {
		mustDecide(t, b, backend.Request{Entity: fmt.Sprintf("ip-%d", i), Resource: "edge", Hits: uint64(1 + i), Defaults: []bucket.Limit{rpm}})
	}
	mustDecide(t, b, backend.Request{Entity: "ip-0", Resource: "api", Hits: 1, Defaults: []bucket.Limit{rpm}})

	bk, ok, err := a.GetBucket(ctx, "ip-3", "edge")
	if err != nil || !ok {
		t.Fatalf("GetBucket: %v, %v", ok, err)
	}
	if len(bk.Limits) != 1 || bk.Limits[0] != (bucket.Limit{Name: "rpm", Amount: rpm.Amount, Period: rpm.Period, Burst: rpm.Burst}) ||
		bk.States[0].Tokens != 56_000 || bk.States[0].Consumed != 4000 {
		t.Errorf("bucket %+v: want 56 of 60 tokens, 4 consumed", bk)
	}
	// Default-sourced: ttl = now + time to fill (60 s) x 7.
	if want := ceilSeconds(e.clock.now() + 7*bucket.Minute); bk.TTL != want {
		t.Errorf("ttl %d, want %d", bk.TTL, want)
	}
	if _, ok, err := a.GetBucket(ctx, "ip-3", "api"); err != nil || ok {
		t.Errorf("a bucket never written: ok=%v, %v", ok, err)
	}

	var listed []string
	if err := a.Buckets(ctx, "edge", func(r backend.BucketRef) error {
		if r.Resource != "edge" || r.Cfg != bucket.Fingerprint([]bucket.Limit{rpm}) {
			t.Errorf("listed %+v", r)
		}
		listed = append(listed, r.Entity)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(listed)
	if want := []string{"ip-0", "ip-1", "ip-2", "ip-3", "ip-4", "ip-5", "ip-6"}; !slices.Equal(listed, want) {
		t.Errorf("buckets of edge %v, want %v", listed, want)
	}
	stop := errors.New("stop")
	calls := 0
	if err := a.Buckets(ctx, "edge", func(backend.BucketRef) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Errorf("a callback's error: %v after %d calls; want it returned at once", err, calls)
	}

	// Past its ttl a bucket is absent, as for decisions.
	e.clock.advance(8 * bucket.Minute)
	if _, ok, err := a.GetBucket(ctx, "ip-3", "edge"); err != nil || ok {
		t.Errorf("expired bucket: ok=%v, %v", ok, err)
	}
}

func TestAdminAllConfigsAndPrefixes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	plain, blue := e.admin(t, ""), e.admin(t, "blue")
	plain.pageSize, blue.pageSize = 2, 2
	rpm := []bucket.Limit{lim(t, "rpm", "1/s", -1)}
	for _, a := range []*Admin{plain, blue} {
		for _, k := range []backend.RecordKey{backend.SystemKey(), backend.ResourceKey("r"), backend.EntityKey("e", "r")} {
			if _, err := a.PutConfig(ctx, k, rpm, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := blue.PutConfig(ctx, backend.EntityKey("e#2", backend.DefaultResource), rpm, 0); err != nil {
		t.Fatal(err)
	}
	mustDecide(t, e.replica(t, Options{KeyPrefix: "blue"}), backend.Request{Entity: "e", Resource: "r", Hits: 1})
	for _, c := range []struct {
		a    *Admin
		want []string
	}{
		{plain, []string{"entity \"e\" resource \"r\"", "resource \"r\"", "system"}},
		{blue, []string{"entity \"e\" resource \"r\"", "entity \"e#2\" resource \"_default_\"", "resource \"r\"", "system"}},
	} {
		var got []string
		if err := c.a.AllConfigs(ctx, func(cf backend.Config) error {
			got = append(got, cf.Key.String())
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		sort.Strings(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("prefix %q: configs %q, want %q", c.a.keys.prefix, got, c.want)
		}
	}
}

func TestAdminAppliedSet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	ctx := t.Context()
	refs, v, err := a.Applied(ctx)
	if err != nil || v != 0 || len(refs) != 0 {
		t.Fatalf("Applied on a new table: %v, %d, %v", refs, v, err)
	}
	want := []backend.RecordKey{backend.SystemKey(), backend.ResourceKey("chat"), backend.EntityKey("acme", backend.DefaultResource)}
	if err := a.SetApplied(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	// A second apply that read version 0 too loses.
	if err := a.SetApplied(ctx, nil, 0); !errors.Is(err, backend.ErrAppliedChanged) {
		t.Fatalf("racing apply: %v, want backend.ErrAppliedChanged", err)
	}
	refs, v, err = a.Applied(ctx)
	if err != nil || v != 1 || !slices.Equal(refs, want) {
		t.Fatalf("Applied = %v, %d, %v; want %v at version 1", refs, v, err, want)
	}
	if err := a.SetApplied(ctx, want[:1], 1); err != nil {
		t.Fatal(err)
	}
	if err := a.SetApplied(ctx, want, 1); !errors.Is(err, backend.ErrAppliedChanged) {
		t.Fatalf("stale version: %v", err)
	}
	// The applied set is no config: decisions and listings ignore it.
	if r, err := a.Effective(ctx, "acme", "chat"); err != nil || r.Level != backend.LevelNone {
		t.Errorf("effective %+v, %v", r, err)
	}
}

func (h *halfBatches) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	do := map[string]types.KeysAndAttributes{}
	left := map[string]types.KeysAndAttributes{}
	for table, ka := range in.RequestItems {
		k := (len(ka.Keys) + 1) / 2
		first, rest := ka, ka
		first.Keys, rest.Keys = ka.Keys[:k], ka.Keys[k:]
		do[table] = first
		if len(rest.Keys) > 0 {
			left[table] = rest
		}
	}
	out, err := h.AdminAPI.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: do}, o...)
	if err != nil {
		return nil, err
	}
	out.UnprocessedKeys = left
	return out, nil
}

// GetConfigs reads many records 100 to a batch, asks again for what
// DynamoDB leaves unprocessed, and leaves out the missing ones.
func TestAdminGetConfigsInBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	ctx := t.Context()
	var keys []backend.RecordKey
	for i := range 150 {
		k := backend.EntityKey(fmt.Sprintf("e%d", i), "chat")
		if _, err := a.PutConfig(ctx, k, []bucket.Limit{lim(t, "rpm", fmt.Sprintf("%d/min", i+1), -1)}, 0); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	missing := backend.ResourceKey("nothing-here")
	keys = append(keys, missing, keys[0]) // a missing record, and one asked twice
	got, err := e.admin(t, "", &halfBatches{AdminAPI: e.client}).GetConfigs(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 150 {
		t.Fatalf("%d records, want 150", len(got))
	}
	for i := range 150 {
		k := backend.EntityKey(fmt.Sprintf("e%d", i), "chat")
		if c := got[k]; c.Key != k || len(c.Limits) != 1 || c.Limits[0].Amount != int64(i+1)*bucket.Milli {
			t.Fatalf("%s: %+v", k, c)
		}
	}
	if _, ok := got[missing]; ok {
		t.Error("a missing record was returned")
	}
	if _, err := a.GetConfigs(ctx, []backend.RecordKey{{Entity: "no-resource"}}); err == nil {
		t.Error("an invalid key was accepted")
	}
}
