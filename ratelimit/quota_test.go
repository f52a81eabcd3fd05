package ratelimit_test

import (
	"encoding/json"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/ratelimit"
)

// Two model quotas a caller may fall back between, and a plain limit.
const quotaRules = `
domain: q
descriptors:
  - key: model
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {backend: {name: a, tier: 1}}
  - key: model
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {backend: {name: b, zone: eu}, other: x}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {plan: free}
  - key: open
    rate_limit: {unlimited: true}
`

func quotaService(t *testing.T, opts ratelimit.Options) rlsv3.RateLimitServiceClient {
	t.Helper()
	be := memory.New(memory.Options{SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	return serve(t, ratelimit.New(rules(t, quotaRules), be, opts))
}

func statusCodes(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	out := []rlsv3.RateLimitResponse_Code{resp.OverallCode}
	for _, st := range resp.Statuses {
		out = append(out, st.Code)
	}
	return out
}

// quota_mode, as in envoyproxy/ratelimit: a descriptor in quota mode over
// its limit keeps its OVER_LIMIT status but fails the request only when
// every quota-mode descriptor of the request is over; a descriptor not in
// quota mode fails it alone; unlimited descriptors count as neither. The
// global setting puts every limited descriptor in quota mode.
func TestQuotaMode(t *testing.T) {
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	models := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*rlv3.RateLimitDescriptor{desc("model", "a"), desc("model", "b"), desc("open", "x")}}
	c := quotaService(t, ratelimit.Options{})
	for i, want := range [][]rlsv3.RateLimitResponse_Code{
		{ok, ok, ok, ok},       // both quotas have room
		{ok, over, ok, ok},     // a spent: b still has room, the request passes
		{over, over, over, ok}, // both spent
	} {
		if got := statusCodes(call(t, c, models)); !slicesEqual(got, want) {
			t.Errorf("models, call %d: codes %v, want %v (overall first)", i+1, got, want)
		}
	}
	// A plain limit over fails the request, whatever the quotas say.
	c = quotaService(t, ratelimit.Options{})
	mixed := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "u"), desc("model", "b")}}
	call(t, c, mixed)
	if got, want := statusCodes(call(t, c, mixed)), []rlsv3.RateLimitResponse_Code{over, over, ok}; !slicesEqual(got, want) {
		t.Errorf("user over, model b within: codes %v, want %v", got, want)
	}
	// QUOTA_MODE for every rule: the user limit is a quota too.
	c = quotaService(t, ratelimit.Options{QuotaMode: true})
	call(t, c, mixed)
	if got, want := statusCodes(call(t, c, mixed)), []rlsv3.RateLimitResponse_Code{ok, over, ok}; !slicesEqual(got, want) {
		t.Errorf("global quota mode, user over, model b within: codes %v, want %v", got, want)
	}
	// Shadow mode still answers OK over everything.
	c = quotaService(t, ratelimit.Options{ShadowMode: true})
	for range 3 {
		if got := call(t, c, models).OverallCode; got != ok {
			t.Fatalf("shadow mode: overall %v", got)
		}
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The response's dynamic metadata, behind its flag, in envoyproxy/ratelimit's
// shape: the domain, every descriptor's entries (and its own hits_addend
// or limit override), the request's hits_addend when set, and the
// metadata of the rules of the descriptors that passed, merged with the
// first value of a key winning and mappings merged key by key.
func TestDynamicMetadata(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("model", "a"), desc("model", "b"), desc("nomatch", "z")}}
	if md := call(t, quotaService(t, ratelimit.Options{}), req).DynamicMetadata; md != nil {
		t.Errorf("dynamic metadata without the flag: %v", md)
	}
	c := quotaService(t, ratelimit.Options{DynamicMetadata: true})
	want := []string{
		// Both passed: a's name wins, b adds its zone and other.
		`{"descriptors":[{"entries":["model=a"]},{"entries":["model=b"]},{"entries":["nomatch=z"]}],"domain":"q",` +
			`"metadata":{"backend":{"name":"a","tier":1,"zone":"eu"},"other":"x"}}`,
		// a is spent: only b's metadata.
		`{"descriptors":[{"entries":["model=a"]},{"entries":["model=b"]},{"entries":["nomatch=z"]}],"domain":"q",` +
			`"metadata":{"backend":{"name":"b","zone":"eu"},"other":"x"}}`,
		// Both spent: no metadata.
		`{"descriptors":[{"entries":["model=a"]},{"entries":["model=b"]},{"entries":["nomatch=z"]}],"domain":"q"}`,
	}
	for i, w := range want {
		if got := canonicalJSON(t, call(t, c, req).DynamicMetadata); got != canonicalJSON(t, mustStruct(t, w)) {
			t.Errorf("call %d: dynamic metadata\n got %s\nwant %s", i+1, got, w)
		}
	}
	// Hits: the request's and a descriptor's own.
	d := desc("user", "v")
	d.HitsAddend = wrapperspb.UInt64(0)
	md := call(t, c, &rlsv3.RateLimitRequest{Domain: "q", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{d}}).DynamicMetadata
	w := `{"descriptors":[{"entries":["user=v"],"hitsAddend":0}],"domain":"q","hitsAddend":3,"metadata":{"plan":"free"}}`
	if got := canonicalJSON(t, md); got != canonicalJSON(t, mustStruct(t, w)) {
		t.Errorf("with hits: dynamic metadata\n got %s\nwant %s", got, w)
	}
}

func mustStruct(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(js), s); err != nil {
		t.Fatal(err)
	}
	return s
}

// canonicalJSON renders s with its keys sorted, for comparison.
func canonicalJSON(t *testing.T, s *structpb.Struct) string {
	t.Helper()
	if s == nil {
		return "null"
	}
	b, err := s.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// Only a descriptor that some limit decided is a quota and brings its
// rule's metadata, as in envoyproxy/ratelimit, which gives a replaced
// descriptor, or one ending at a node without rate_limit, no limit at
// all: neither stops a request whose every real quota is spent from
// being over, and neither adds its rule's metadata to a passing answer.
// Under the global quota mode every descriptor but an unlimited one is a
// quota, as QUOTA_MODE makes it there.
func TestQuotaModeCountsOnlyLimitedDescriptors(t *testing.T) {
	const yaml = `
domain: r
descriptors:
  - key: model
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {a: 1}
  - key: model
    value: old
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: old}
    metadata: {old: 1}
  - key: model
    value: new
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, replaces: [{name: old}]}
  - key: tag
    quota_mode: true
    metadata: {tag: 1}
`
	newClient := func(opts ratelimit.Options) rlsv3.RateLimitServiceClient {
		be := memory.New(memory.Options{SweepInterval: -1})
		t.Cleanup(func() { be.Close() })
		return serve(t, ratelimit.New(rules(t, yaml), be, opts))
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	req := &rlsv3.RateLimitRequest{Domain: "r", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("model", "a"), desc("model", "old"), desc("model", "new"), desc("tag", "x")}}
	c := newClient(ratelimit.Options{DynamicMetadata: true})
	first := call(t, c, req)
	if got, want := statusCodes(first), []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, ok}; !slicesEqual(got, want) {
		t.Errorf("first call: codes %v, want %v (overall first)", got, want)
	}
	if got, want := canonicalJSON(t, first.DynamicMetadata.GetFields()["metadata"].GetStructValue()), `{"a":1}`; got != want {
		t.Errorf("first call: metadata %s, want %s: only a was decided by a limit", got, want)
	}
	// a and new are spent; old (replaced) and tag (no limit) are no
	// quotas with room.
	second := call(t, c, req)
	if got, want := statusCodes(second), []rlsv3.RateLimitResponse_Code{over, over, ok, over, ok}; !slicesEqual(got, want) {
		t.Errorf("second call: codes %v, want %v (overall first)", got, want)
	}
	if md := second.DynamicMetadata.GetFields()["metadata"]; md != nil {
		t.Errorf("second call: metadata %v, want none", md)
	}
	// QUOTA_MODE: old and tag are quotas too, and they pass.
	c = newClient(ratelimit.Options{QuotaMode: true})
	call(t, c, req)
	if got, want := statusCodes(call(t, c, req)), []rlsv3.RateLimitResponse_Code{ok, over, ok, over, ok}; !slicesEqual(got, want) {
		t.Errorf("global quota mode, second call: codes %v, want %v (overall first)", got, want)
	}
}

// Two backends, each guarded by a tenant's bucket and a default bucket,
// as Envoy AI Gateway's QuotaPolicy sends them (its issue 2460): with the
// group keys, a backend whose tenant bucket is spent is spent, though its
// default bucket has room; the request is over once every backend is,
// and the metadata names only the backends with room. Without them, every
// descriptor is a quota of its own (envoyproxy/ratelimit): the default
// buckets keep the request passing and the spent backend listed.
func TestQuotaGroups(t *testing.T) {
	const yaml = `
domain: g
descriptors:
  - key: backend
    value: a
    descriptors:
      - key: tenant
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
        metadata: {up: {a: tenant}}
      - key: default
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 10}
        metadata: {up: {a: default}}
  - key: backend
    value: b
    descriptors:
      - key: tenant
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 2}
        metadata: {up: {b: tenant}}
      - key: default
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 10}
        metadata: {up: {b: default}}
  - key: spare
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
    metadata: {spare: true}
`
	newClient := func(keys ...string) rlsv3.RateLimitServiceClient {
		be := memory.New(memory.Options{SweepInterval: -1})
		t.Cleanup(func() { be.Close() })
		return serve(t, ratelimit.New(rules(t, yaml), be, ratelimit.Options{DynamicMetadata: true, QuotaGroupKeys: keys}))
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	req := &rlsv3.RateLimitRequest{Domain: "g", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("backend", "a", "tenant", "acme"), desc("backend", "a", "default", "d"),
		desc("backend", "b", "tenant", "acme"), desc("backend", "b", "default", "d")}}
	type step struct {
		codes    []rlsv3.RateLimitResponse_Code
		metadata string
	}
	for _, tc := range []struct {
		name  string
		keys  []string
		steps []step
	}{
		{"grouped by backend", []string{"backend"}, []step{
			{[]rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, ok}, `{"up":{"a":"tenant","b":"tenant"}}`},
			// a's tenant bucket is spent: a is, b is not.
			{[]rlsv3.RateLimitResponse_Code{ok, over, ok, ok, ok}, `{"up":{"b":"tenant"}}`},
			// Both spent: over, though both default buckets have room.
			{[]rlsv3.RateLimitResponse_Code{over, over, ok, over, ok}, `null`},
		}},
		{"each descriptor its own quota", nil, []step{
			{[]rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, ok}, `{"up":{"a":"tenant","b":"tenant"}}`},
			{[]rlsv3.RateLimitResponse_Code{ok, over, ok, ok, ok}, `{"up":{"a":"default","b":"tenant"}}`},
			{[]rlsv3.RateLimitResponse_Code{ok, over, ok, over, ok}, `{"up":{"a":"default","b":"default"}}`},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(tc.keys...)
			for i, s := range tc.steps {
				resp := call(t, c, req)
				if got := statusCodes(resp); !slicesEqual(got, s.codes) {
					t.Errorf("call %d: codes %v, want %v (overall first)", i+1, got, s.codes)
				}
				if got := canonicalJSON(t, resp.DynamicMetadata.GetFields()["metadata"].GetStructValue()); got != s.metadata {
					t.Errorf("call %d: metadata %s, want %s", i+1, got, s.metadata)
				}
			}
		})
	}
	// A quota descriptor with none of the keys is a quota of its own: with
	// room, it keeps a request passing whose backends are all spent.
	c := newClient("backend")
	withSpare := &rlsv3.RateLimitRequest{Domain: "g", Descriptors: append(req.Descriptors[:4:4], desc("spare", "s"))}
	for range 2 {
		call(t, c, withSpare)
	}
	resp := call(t, c, withSpare)
	if got, want := statusCodes(resp), []rlsv3.RateLimitResponse_Code{ok, over, ok, over, ok, ok}; !slicesEqual(got, want) {
		t.Errorf("with a spare quota: codes %v, want %v (overall first)", got, want)
	}
	if got, want := canonicalJSON(t, resp.DynamicMetadata.GetFields()["metadata"].GetStructValue()), `{"spare":true}`; got != want {
		t.Errorf("with a spare quota: metadata %s, want %s", got, want)
	}
}
