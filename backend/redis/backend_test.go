package redis

import (
	"context"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// fakeClock is a settable clock in epoch milliseconds.
type fakeClock struct{ ms atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ms.Store(1_700_000_000_000)
	return c
}

func (c *fakeClock) now() int64       { return c.ms.Load() }
func (c *fakeClock) advance(ms int64) { c.ms.Add(ms) }

func newBackend(t *testing.T, c rueidis.Client, o Options) *Backend {
	t.Helper()
	b, err := New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// putRecord writes a config record's hash as an operator's tool does.
func putRecord(t *testing.T, srv *redistest.Server, key string, limits []bucket.Limit) {
	t.Helper()
	if _, err := srv.Do(context.Background(), append([]string{"HSET", key}, recordFields(limits)...)...); err != nil {
		t.Fatal(err)
	}
}

// randomSpecs are zero to three limits as an operator writes them, in
// name order (the order a stored record reads back in).
func randomSpecs(r *rand.Rand) []bucket.Spec {
	rates := []string{"0/s", "1/s", "3/s", "10/min", "100/min", "7/h", "2/day", "1000/s", "5/week"}
	n := r.IntN(4)
	out := make([]bucket.Spec, 0, n)
	for i := range n {
		s := bucket.Spec{Name: []string{"a.rpm", "b_tpm", "c-x"}[i], Rate: rates[r.IntN(len(rates))]}
		if r.IntN(3) == 0 {
			burst := r.Int64N(20)
			s.Burst = &burst
		}
		if r.IntN(4) == 0 {
			s.Cost = "request"
		}
		out = append(out, s)
	}
	return out
}

func specLimits(t *testing.T, specs []bucket.Spec) []bucket.Limit {
	t.Helper()
	out := make([]bucket.Limit, 0, len(specs))
	for _, s := range specs {
		l, err := s.Limit()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// The Redis backend decides as the memory backend does: the same
// operator records at every level (written to Redis as hashes, to the
// memory backend as its overrides file), the same clock, and thousands of
// random requests (entities and resources at every level, defaults from
// the mapping config or none, cascades to a parent named by the request
// or by the entity's META, in a hierarchy three deep, checks, weights,
// refunds, the clock standing still or jumping hours) get equal
// decisions: allowed, limits, every limit's cost, tokens and wait, the
// binding limit and the level.
func TestDecidesAsMemory(t *testing.T) {
	srv := redistest.Require(t)
	decidesAsMemory(t, newClient(t, srv), 4000)
}

// On a Redis Cluster of three primaries too: the config records of one
// bucket are spread over the nodes and read in one pipelined batch per
// node, and the scripts of cascades three deep touch keys of one slot.
func TestDecidesAsMemoryOnACluster(t *testing.T) {
	cluster := redistest.RequireCluster(t, 3)
	client, err := Dial(context.Background(), Conn{URL: cluster.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if n := len(client.Nodes()); n != 3 {
		t.Fatalf("the client knows %d nodes, want the cluster's 3", n)
	}
	decidesAsMemory(t, client, 1500)
}

// hset writes fields into the hash at key through client (on a Cluster,
// to the node that holds it).
func hset(t *testing.T, client rueidis.Client, key string, fields ...string) {
	t.Helper()
	if err := client.Do(context.Background(), client.B().Arbitrary("HSET").Keys(key).Args(fields...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

func decidesAsMemory(t *testing.T, client rueidis.Client, requests int) {
	r := rand.New(rand.NewPCG(3, 5))
	entities := []string{"acme", "globex", "a:b{c}", "trial 7", "ünï"}
	resources := []string{"chat", "embed", "x:y"}

	type block struct {
		Limits []bucket.Spec `yaml:"limits"`
	}
	file := struct {
		System    *block                      `yaml:"system,omitempty"`
		Resources map[string]block            `yaml:"resources,omitempty"`
		Entities  map[string]map[string]block `yaml:"entities,omitempty"`
	}{Resources: map[string]block{}, Entities: map[string]map[string]block{}}
	keys := Keys{}
	if specs := randomSpecs(r); len(specs) > 0 {
		file.System = &block{specs}
		hset(t, client, keys.SystemConfig(), recordFields(specLimits(t, specs))...)
	}
	for _, res := range resources[:2] {
		if specs := randomSpecs(r); len(specs) > 0 {
			file.Resources[res] = block{specs}
			hset(t, client, keys.ResourceConfig(res), recordFields(specLimits(t, specs))...)
		}
	}
	for _, e := range entities {
		file.Entities[e] = map[string]block{}
		for _, res := range append(slices.Clone(resources), backend.DefaultResource) {
			if r.IntN(3) != 0 {
				continue
			}
			if specs := randomSpecs(r); len(specs) > 0 {
				file.Entities[e][res] = block{specs}
				hset(t, client, keys.EntityConfig(e, res), recordFields(specLimits(t, specs))...)
			}
		}
	}
	data, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	ov, err := memory.ParseOverrides(data)
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	mem := memory.New(memory.Options{Overrides: ov, TTLMultiplier: backend.DefaultTTLMultiplier, Now: clk.now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	rb := newBackend(t, client, Options{TTLMultiplier: backend.DefaultTTLMultiplier, Now: clk.now})
	defaults := [][]bucket.Limit{nil, specLimits(t, []bucket.Spec{{Name: "d", Rate: "5/s"}}),
		specLimits(t, []bucket.Spec{{Name: "a.rpm", Rate: "3/min"}, {Name: "z", Rate: "100/h", Cost: "request"}})}

	// A hierarchy three deep, and an entity that names itself.
	parents := map[string]string{"acme": "globex", "a:b{c}": "acme", "trial 7": "trial 7"}
	for e, p := range parents {
		hset(t, client, keys.Meta(e), metaFields(backend.Entity{Parent: p, Cascade: true})...)
	}
	ctx := context.Background()
	limited, denied := 0, 0
	for i := range requests {
		switch r.IntN(5) {
		case 0, 1: // the same millisecond
		case 2:
			clk.advance(r.Int64N(500))
		case 3:
			clk.advance(r.Int64N(60_000))
		case 4:
			clk.advance(r.Int64N(10 * 3_600_000))
		}
		req := backend.Request{
			Entity:   entities[r.IntN(len(entities))],
			Resource: resources[r.IntN(len(resources))],
			Defaults: defaults[r.IntN(len(defaults))],
			Hits:     uint64(r.IntN(4)),
			Refund:   r.IntN(10) == 0,
		}
		// Each entity has one parent, or none, in its META; the memory
		// backend has no META, so its requests name the parent, and half
		// of Redis's do too.
		if r.IntN(20) == 0 {
			req.Hits = r.Uint64N(1000)
		}
		req.Parent = parents[req.Entity]
		redisReq := req
		if r.IntN(2) == 0 {
			redisReq.Parent = ""
		}
		dm, err := mem.Decide(ctx, &req)
		if err != nil {
			t.Fatal(err)
		}
		dr, err := rb.Decide(ctx, &redisReq)
		if err != nil {
			t.Fatalf("request %d %+v: %v", i, req, err)
		}
		if !reflect.DeepEqual(dm, dr) {
			t.Fatalf("request %d %+v at %d:\n memory %+v\n redis  %+v", i, req, clk.now(), dm, dr)
		}
		if dr.Limited() {
			limited++
			if !dr.Allowed {
				denied++
			}
		}
	}
	if limited < requests/2 || denied < requests/10 || limited-denied < requests/10 {
		t.Fatalf("%d of %d requests limited, %d denied: the records and defaults exercise too little", limited, requests, denied)
	}
}

// pttl is the PTTL of key: -1 for none, -2 for no key.
func pttl(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	s, err := srv.Do(context.Background(), "PTTL", key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("PTTL %s: %q", key, s)
	}
	return n
}

// Every bucket key carries the TTL of ADR-119 and ADR-128: seven times
// its slowest limit's time to fill when its limits come from a default
// (the resource's, the mapping config's, the system's, the entity's
// _default_) or a sync-written entity config, and none when an
// operator wrote the entity's limits; a bucket moving from one to the
// other takes the new rule on its next write.
func TestBucketTTLs(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	keys := Keys{}
	ctx := context.Background()
	putRecord(t, srv, keys.EntityConfig("op", "chat"), specLimits(t, []bucket.Spec{{Name: "rpm", Rate: "10/min"}}))
	putRecord(t, srv, keys.EntityConfig("synced", "chat"), specLimits(t, []bucket.Spec{{Name: "rpm", Rate: "10/min"}}))
	if _, err := srv.Do(ctx, "HSET", keys.EntityConfig("synced", "chat"), fieldTTL, strconv.FormatInt(time.Now().Unix()+3600, 10)); err != nil {
		t.Fatal(err)
	}
	putRecord(t, srv, keys.EntityConfig("wide", backend.DefaultResource), specLimits(t, []bucket.Spec{{Name: "rph", Rate: "10/h"}}))
	putRecord(t, srv, keys.ResourceConfig("embed"), specLimits(t, []bucket.Spec{{Name: "rps", Rate: "5/s"}, {Name: "rpd", Rate: "100/day"}}))
	putRecord(t, srv, keys.SystemConfig(), specLimits(t, []bucket.Spec{{Name: "rps", Rate: "2/s"}}))
	rb := newBackend(t, client, Options{TTLMultiplier: 7})
	fileLimits := specLimits(t, []bucket.Spec{{Name: "rpm", Rate: "60/min"}})

	for _, c := range []struct {
		entity, resource string
		defaults         []bucket.Limit
		want             int64 // ms; -1: no TTL
	}{
		{"op", "chat", nil, -1},
		{"synced", "chat", nil, 7 * time.Minute.Milliseconds()},
		{"wide", "chat", nil, 7 * time.Hour.Milliseconds()},
		{"anyone", "embed", nil, 7 * 24 * time.Hour.Milliseconds()},
		{"anyone", "chat", fileLimits, 7 * time.Minute.Milliseconds()},
		{"anyone", "other", nil, 7 * time.Second.Milliseconds()},
	} {
		if _, err := rb.Decide(ctx, &backend.Request{Entity: c.entity, Resource: c.resource, Defaults: c.defaults, Hits: 1}); err != nil {
			t.Fatal(err)
		}
		got := pttl(t, srv, keys.Bucket(c.entity, c.resource, ""))
		if c.want == -1 && got != -1 || c.want != -1 && (got <= c.want-5000 || got > c.want) {
			t.Errorf("%s/%s: PTTL %d ms, want %d", c.entity, c.resource, got, c.want)
		}
	}

	// The operator removes op's own limits: the bucket falls back to the
	// system default and expires like it, from its next write on.
	if _, err := srv.Do(ctx, "DEL", keys.EntityConfig("op", "chat")); err != nil {
		t.Fatal(err)
	}
	fresh := newBackend(t, client, Options{TTLMultiplier: 7}) // no cached records
	if _, err := fresh.Decide(ctx, &backend.Request{Entity: "op", Resource: "chat", Hits: 1}); err != nil {
		t.Fatal(err)
	}
	if got := pttl(t, srv, keys.Bucket("op", "chat", "")); got <= 0 || got > 7000 {
		t.Errorf("op/chat on the system default: PTTL %d ms, want at most 7000", got)
	}
}

// A cascade charges the entity's bucket and its parent's in one script
// run, both or neither: the parent named by the request, or by the
// entity's META when it asks for cascade. The child's bucket is tagged
// with its parent, so the two keys share a Cluster slot.
func TestCascade(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	keys := Keys{}
	ctx := context.Background()
	putRecord(t, srv, keys.EntityConfig("org", "chat"), specLimits(t, []bucket.Spec{{Name: "rpm", Rate: "3/min"}}))
	putRecord(t, srv, keys.EntityConfig("team-a", "chat"), specLimits(t, []bucket.Spec{{Name: "rpm", Rate: "2/min"}}))
	putRecord(t, srv, keys.EntityConfig("team-b", "chat"), specLimits(t, []bucket.Spec{{Name: "rpm", Rate: "2/min"}}))
	if _, err := srv.Do(ctx, append([]string{"HSET", keys.Meta("team-b")}, metaFields(backend.Entity{Parent: "org", Cascade: true})...)...); err != nil {
		t.Fatal(err)
	}
	// A stopped clock: at 3 a minute a bucket gains a thousandth of a hit
	// every 20 ms, and the exact counts below must not depend on how fast
	// the machine runs the five decisions.
	rb := newBackend(t, client, Options{TTLMultiplier: 7, Now: newFakeClock().now})
	decide := func(entity, parent string) backend.Decision {
		t.Helper()
		d, err := rb.Decide(ctx, &backend.Request{Entity: entity, Parent: parent, Resource: "chat", Hits: 1})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// team-a names org in the request, team-b through its META: org's 3
	// a minute are shared, each team has 2.
	var got []bool
	for _, e := range []string{"team-a", "team-b", "team-a", "team-b", "team-a"} {
		parent := ""
		if e == "team-a" {
			parent = "org"
		}
		d := decide(e, parent)
		got = append(got, d.Allowed)
		if len(d.Limits) != 2 {
			t.Fatalf("%s: charged %d limits, want the team's and org's", e, len(d.Limits))
		}
	}
	if want := []bool{true, true, true, false, false}; !slices.Equal(got, want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
	// A denial charged nobody: org holds 0 and each team what it spent.
	for _, k := range []struct {
		key  string
		left string
	}{{keys.Bucket("org", "chat", ""), "0"}, {keys.Bucket("team-a", "chat", "org"), "0"}, {keys.Bucket("team-b", "chat", "org"), "1000"}} {
		v, err := srv.Do(ctx, "HGET", k.key, "b_rpm_tk")
		if err != nil || v != k.left {
			t.Errorf("%s: b_rpm_tk %q (%v), want %s", k.key, v, err, k.left)
		}
	}
	// org itself, deciding on its own bucket, sees it spent.
	if d := decide("org", ""); d.Allowed {
		t.Error("org allowed with its bucket spent by its teams")
	}
}

// Decide answers within the caller's deadline however Redis fails, with
// an error the service's failure policy turns into its answer.
func TestDecideWithinDeadline(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	rb := newBackend(t, client, Options{})
	req := &backend.Request{Entity: "e", Resource: "chat", Hits: 1,
		Defaults: specLimits(t, []bucket.Spec{{Name: "rps", Rate: "100/s"}})}
	if _, err := rb.Decide(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		start := time.Now()
		_, err := rb.Decide(ctx, req)
		took := time.Since(start)
		cancel()
		if err == nil {
			t.Fatal("decided with Redis paused")
		}
		// 50 ms, with room for a busy machine's scheduling.
		if took > time.Second {
			t.Fatalf("answered after %v with a 50 ms deadline", took)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := rb.Decide(context.Background(), req); err != nil {
		t.Fatalf("after Redis resumed: %v", err)
	}
}
