package ratelimit_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors/xds"
	"github.com/sluice-rl/sluice/descriptors/xds/xdstest"
	"github.com/sluice-rl/sluice/ratelimit"
)

// Envoy AI Gateway's QuotaPolicy, as its controller and its Envoy talk to
// their rate-limit service, here with Sluice as that service:
//
//   - the controller sends one RateLimitConfig over xDS, domain and name
//     ai-gateway-quota: per backend a backend_name node ("namespace/name"),
//     under it a model_name_override node per model, and under that one
//     quota_mode leaf per bucket rule (a header selector of Exact type is
//     a key and value both "rule-<i>-<header>|<value>-match-<j>") and one
//     for the default bucket ("rule-<n>-match--1");
//   - at request time Envoy sends, for every backend the route may pick,
//     one descriptor per bucket the client matches, without hits (one
//     each);
//   - at stream end it sends the backend and model that served, with the
//     response's cost (quota_cost) as each descriptor's own hits_addend.
//
// AI Gateway's controller puts no metadata on its rules yet (its issue
// 2460 asks for the backend's identity there); the rules here carry it,
// one key per backend under a shared mapping, so that the merged metadata
// of the passing rules lists every backend with room.
func TestAIGatewayQuotaPolicy(t *testing.T) {
	const (
		domain    = "ai-gateway-quota"
		model     = "claude-4-sonnet"
		tenant    = "rule-0-x-tenant|acme-match-0"
		byDefault = "rule-1-match--1"
	)
	backends := []string{"ai-gateway/pt-east", "ai-gateway/pt-west"}
	leaf := func(key, backend string, perHour uint32) *rlconfv3.RateLimitDescriptor {
		md, err := structpb.NewStruct(map[string]any{"available": map[string]any{backend: model}})
		if err != nil {
			t.Fatal(err)
		}
		return &rlconfv3.RateLimitDescriptor{Key: key, Value: key, QuotaMode: true, Metadata: md,
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: perHour}}
	}
	cfg := &rlconfv3.RateLimitConfig{Name: domain, Domain: domain}
	for _, b := range backends {
		cfg.Descriptors = append(cfg.Descriptors, &rlconfv3.RateLimitDescriptor{Key: "backend_name", Value: b,
			Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "model_name_override", Value: model,
				Descriptors: []*rlconfv3.RateLimitDescriptor{leaf(tenant, b, 100), leaf(byDefault, b, 10000)}}}})
	}

	srv := xdstest.Start(t)
	srv.Set(t, "v1", cfg)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(srv.ClientCreds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	src, err := xds.Subscribe(ctx, conn, xds.Options{NodeID: xdstest.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-src.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no rules 10 s after the snapshot")
	}

	// The request-time call for a client of tenant acme: both backends,
	// each with its tenant bucket and its default bucket.
	check := &rlsv3.RateLimitRequest{Domain: domain}
	for _, b := range backends {
		check.Descriptors = append(check.Descriptors,
			desc("backend_name", b, "model_name_override", model, tenant, tenant),
			desc("backend_name", b, "model_name_override", model, byDefault, byDefault))
	}
	// The stream-end call of a response served by b that cost n.
	charge := func(b string, n uint64) *rlsv3.RateLimitRequest {
		req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{
			desc("backend_name", b, "model_name_override", model, tenant, tenant),
			desc("backend_name", b, "model_name_override", model, byDefault, byDefault)}}
		for _, d := range req.Descriptors {
			d.HitsAddend = wrapperspb.UInt64(n)
		}
		return req
	}
	available := func(resp *rlsv3.RateLimitResponse) string {
		return canonicalJSON(t, resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue())
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	newClient := func(opts ratelimit.Options) rlsv3.RateLimitServiceClient {
		be := memory.New(memory.Options{SweepInterval: -1})
		t.Cleanup(func() { be.Close() })
		return serve(t, ratelimit.New(src, be, opts))
	}
	c := newClient(ratelimit.Options{DynamicMetadata: true, QuotaGroupKeys: []string{"backend_name", "model_name_override"}})

	resp := call(t, c, check)
	if got, want := statusCodes(resp), []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, ok}; !slicesEqual(got, want) {
		t.Fatalf("first check: codes %v, want %v (overall first)", got, want)
	}
	if got, want := available(resp), `{"available":{"ai-gateway/pt-east":"claude-4-sonnet","ai-gateway/pt-west":"claude-4-sonnet"}}`; got != want {
		t.Errorf("first check: metadata %s, want %s", got, want)
	}
	// pt-east served it, and the response cost 150: more than the
	// tenant's 100 an hour, which the charge takes anyway, into debt.
	call(t, c, charge(backends[0], 150))

	// pt-east is spent for acme though its default bucket has plenty:
	// the request passes, for pt-west, the one the metadata names.
	resp = call(t, c, check)
	if got, want := statusCodes(resp), []rlsv3.RateLimitResponse_Code{ok, over, ok, ok, ok}; !slicesEqual(got, want) {
		t.Errorf("pt-east spent: codes %v, want %v (overall first)", got, want)
	}
	if got, want := available(resp), `{"available":{"ai-gateway/pt-west":"claude-4-sonnet"}}`; got != want {
		t.Errorf("pt-east spent: metadata %s, want %s", got, want)
	}
	// pt-west served it and used acme's hour there too: no backend has
	// room for acme, and the request is over before routing (429).
	call(t, c, charge(backends[1], 150))
	resp = call(t, c, check)
	if got, want := statusCodes(resp), []rlsv3.RateLimitResponse_Code{over, over, ok, over, ok}; !slicesEqual(got, want) {
		t.Errorf("both spent: codes %v, want %v (overall first)", got, want)
	}
	if got := available(resp); got != "null" {
		t.Errorf("both spent: metadata %s, want none", got)
	}

	// Without the group keys, envoyproxy/ratelimit's rule: the default
	// buckets keep acme passing and both backends listed, its tenant
	// limit counted but never enforced (AI Gateway's issue 2460).
	c = newClient(ratelimit.Options{DynamicMetadata: true})
	call(t, c, check)
	call(t, c, charge(backends[0], 150))
	call(t, c, charge(backends[1], 150))
	resp = call(t, c, check)
	if got, want := statusCodes(resp), []rlsv3.RateLimitResponse_Code{ok, over, ok, over, ok}; !slicesEqual(got, want) {
		t.Errorf("without group keys, both tenant buckets spent: codes %v, want %v (overall first)", got, want)
	}
	if got, want := available(resp), `{"available":{"ai-gateway/pt-east":"claude-4-sonnet","ai-gateway/pt-west":"claude-4-sonnet"}}`; got != want {
		t.Errorf("without group keys: metadata %s, want %s", got, want)
	}
}
