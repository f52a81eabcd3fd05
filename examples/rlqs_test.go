package examples

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/rlqs/rlqstest"
)

// rlqsBuckets is the quota filter of rlqs/envoy.yaml, validated into
// Envoy's protos as Envoy would read it: its domain, and each bucket
// settings with the request header (if any) its matcher requires.
type rlqsBuckets struct {
	domain   string
	settings []*rlqsfilterv3.RateLimitQuotaBucketSettings
	headers  []string // the header a settings' matcher requires; "" for the fallback
}

func loadRLQSExample(t *testing.T) rlqsBuckets {
	t.Helper()
	raw, err := os.ReadFile("rlqs/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, bs); err != nil {
		t.Fatalf("rlqs/envoy.yaml is not a v3 Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("rlqs/envoy.yaml fails Envoy's validation rules: %v", err)
	}
	var out rlqsBuckets
	for _, f := range envoyHCM(t, bs).GetHttpFilters() {
		cfg := &rlqsfilterv3.RateLimitQuotaFilterConfig{}
		if !f.GetTypedConfig().MessageIs(cfg) {
			continue
		}
		if err := f.GetTypedConfig().UnmarshalTo(cfg); err != nil {
			t.Fatal(err)
		}
		if got := cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName(); got != "sluice" {
			t.Errorf("the quota filter calls cluster %q, want sluice", got)
		}
		out.domain = cfg.GetDomain()
		m := cfg.GetBucketMatchers()
		for _, fm := range m.GetMatcherList().GetMatchers() {
			in := &matcherv3.HttpRequestHeaderMatchInput{}
			if err := fm.GetPredicate().GetSinglePredicate().GetInput().GetTypedConfig().UnmarshalTo(in); err != nil {
				t.Fatalf("a bucket matcher's input: %v", err)
			}
			out.headers = append(out.headers, in.GetHeaderName())
			out.settings = append(out.settings, bucketSettings(t, fm.GetOnMatch()))
		}
		if m.GetOnNoMatch() != nil {
			out.headers = append(out.headers, "")
			out.settings = append(out.settings, bucketSettings(t, m.GetOnNoMatch()))
		}
	}
	if out.domain == "" || len(out.settings) == 0 {
		t.Fatal("rlqs/envoy.yaml has no rate_limit_quota filter with buckets")
	}
	return out
}

func bucketSettings(t *testing.T, m *xdsmatcherv3.Matcher_OnMatch) *rlqsfilterv3.RateLimitQuotaBucketSettings {
	t.Helper()
	s := &rlqsfilterv3.RateLimitQuotaBucketSettings{}
	if err := m.GetAction().GetTypedConfig().UnmarshalTo(s); err != nil {
		t.Fatalf("a bucket matcher's action: %v", err)
	}
	return s
}

// bucketID is the BucketId the settings s build for a request whose
// header (the one a custom value reads) is value.
func bucketID(t *testing.T, s *rlqsfilterv3.RateLimitQuotaBucketSettings, value string) map[string]string {
	t.Helper()
	id := map[string]string{}
	for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
		switch {
		case v.GetCustomValue() != nil:
			in := &matcherv3.HttpRequestHeaderMatchInput{}
			if err := v.GetCustomValue().GetTypedConfig().UnmarshalTo(in); err != nil {
				t.Fatalf("bucket id key %s: %v", k, err)
			}
			id[k] = value
		default:
			id[k] = v.GetStringValue()
		}
	}
	return id
}

// TestRLQSExampleIsValid: rlqs/envoy.yaml is a bootstrap Envoy accepts;
// its quota filter names a domain of rlqs/config; every bucket it builds
// matches the rule meant for it; and it keeps DESIGN section 15's bound
// (deny before the first assignment and after one expires) with reports
// at most every 5 s.
func TestRLQSExampleIsValid(t *testing.T) {
	ex := loadRLQSExample(t)
	rules, err := descriptors.Load("rlqs/config")
	if err != nil {
		t.Fatal(err)
	}
	if !rules.HasDomain(ex.domain) {
		t.Fatalf("the quota filter's domain %q is not in rlqs/config", ex.domain)
	}
	wantPath := map[string]string{"x-tenant": "quota/api=search/tenant", "": "quota/api=search"}
	for i, s := range ex.settings {
		m, _, ok := rules.MatchBucketID(ex.domain, bucketID(t, s, "acme"))
		if !ok || m.Rule.Path != wantPath[ex.headers[i]] {
			t.Errorf("bucket %d (header %q) matches %v %v, want %s", i, ex.headers[i], ok, m.Rule, wantPath[ex.headers[i]])
		}
		if d := s.GetReportingInterval().AsDuration(); d < time.Second || d > 5*time.Second {
			t.Errorf("bucket %d reports every %v, want 1 s to 5 s", i, d)
		}
		deny := func(r *typev3.RateLimitStrategy) bool {
			return r.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL
		}
		if !deny(s.GetNoAssignmentBehavior().GetFallbackRateLimit()) || !deny(s.GetExpiredAssignmentBehavior().GetFallbackRateLimit()) {
			t.Errorf("bucket %d admits requests no assignment paid for: no_assignment %v, expired %v",
				i, s.GetNoAssignmentBehavior(), s.GetExpiredAssignmentBehavior())
		}
	}
}

// TestRLQSExampleWithSluice: the buckets rlqs/envoy.yaml builds, reported
// by a filter that behaves as Envoy's, get token bucket assignments from
// an in-process Sluice with rlqs/config, each within its rule's limit.
func TestRLQSExampleWithSluice(t *testing.T) {
	ex := loadRLQSExample(t)
	rules, err := descriptors.Load("rlqs/config")
	if err != nil {
		t.Fatal(err)
	}
	be := memory.New(memory.Options{})
	defer be.Close()
	svc := rlqs.New(rlqstest.Rules{Config: rules}, be, rlqs.Options{})
	conn := rlqstest.Serve(t, func(s *grpc.Server) { rlqs.Register(s, svc) })

	got := make(chan rlqstest.Action, 16)
	f, err := rlqstest.Dial(context.Background(), conn, rlqstest.Options{Domain: ex.domain,
		NoAssignment: rlqstest.DenyAll, Expired: rlqstest.DenyAll,
		OnAssignment: func(a rlqstest.Action) { got <- a }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	limit := map[string]uint64{"x-tenant": 10, "": 100}
	for i, s := range ex.settings {
		id := bucketID(t, s, "acme")
		if f.Request(id) {
			t.Errorf("bucket %v: its first request was admitted before any assignment", id)
		}
		select {
		case a := <-got:
			if a.Allow || a.Deny || a.PerFill == 0 || a.Fill != time.Second || a.TTL < time.Second {
				t.Fatalf("bucket %v: assignment %+v, want a token bucket", id, a)
			}
			if a.PerFill > limit[ex.headers[i]] || a.MaxTokens > limit[ex.headers[i]] {
				t.Errorf("bucket %v: %d a second, burst %d: over the rule's %d", id, a.PerFill, a.MaxTokens, limit[ex.headers[i]])
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("bucket %v: no assignment within 5 s", id)
		}
		if !f.Request(id) {
			t.Errorf("bucket %v: a request after the assignment was denied", id)
		}
	}
}
