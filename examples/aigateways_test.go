package examples

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1a2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
)

// The token policy of docs/ai-gateways.md decodes strictly into Envoy
// Gateway's BackendTrafficPolicy, as the API server would take it, and
// is the one whose calls Sluice counts as a check and then a charge: a
// cost of nothing at request time (without it every request would also
// take a token as it arrives) and Envoy AI Gateway's token count when the
// response ends. The manual shows the file as it is.
func TestAIGatewayTokenPolicy(t *testing.T) {
	var p egv1a1.BackendTrafficPolicy
	decodeAIExample(t, "token-policy.yaml", &p)
	if p.Kind != "BackendTrafficPolicy" || p.Spec.RateLimit == nil || p.Spec.RateLimit.Global == nil {
		t.Fatalf("token-policy.yaml is not a global rate limit: %+v", p)
	}
	rules := p.Spec.RateLimit.Global.Rules
	if len(rules) != 2 {
		t.Fatalf("%d rules, want the token rule and the request rule", len(rules))
	}
	cost := rules[0].Cost
	switch {
	case cost == nil || cost.Request == nil || cost.Response == nil:
		t.Fatalf("the token rule has no request and response cost: %+v", cost)
	case cost.Request.From != egv1a1.RateLimitCostFromNumber || cost.Request.Number == nil || *cost.Request.Number != 0:
		t.Errorf("the token rule's request cost is %+v, want the number 0 (a check)", cost.Request)
	case cost.Response.From != egv1a1.RateLimitCostFromMetadata || cost.Response.Metadata == nil ||
		cost.Response.Metadata.Namespace != "io.envoy.ai_gateway" || cost.Response.Metadata.Key != "llm_total_token":
		t.Errorf("the token rule's response cost is %+v, want Envoy AI Gateway's llm_total_token", cost.Response)
	}
	if rules[1].Cost != nil {
		t.Errorf("the request rule has a cost (%+v): each request should take one as it arrives", rules[1].Cost)
	}
	manualShows(t, "token-policy.yaml", "apiVersion:")
}

// decodeAIExample decodes examples/ai-gateways/name (YAML) strictly into
// v, as the API server (or the gateway's config loader) would take it.
func decodeAIExample(t *testing.T, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("ai-gateways", name))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yamlToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := strictJSON(js, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// manualShows fails t unless docs/ai-gateways.md shows
// examples/ai-gateways/name as it is, from its line that begins with
// start on: the file's header comment is the file's own.
func manualShows(t *testing.T, name, start string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "ai-gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("ai-gateways", name))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(raw), start)
	if i < 0 {
		t.Fatalf("examples/ai-gateways/%s has no %q", name, start)
	}
	if !strings.Contains(string(doc), "```yaml\n"+string(raw[i:])+"```") {
		t.Errorf("docs/ai-gateways.md does not show examples/ai-gateways/%s as it is", name)
	}
}

// quotaPolicy is Envoy AI Gateway's QuotaPolicy (aigateway.envoyproxy.io/
// v1alpha1), written here field by field from its API's definition: the Go
// module github.com/envoyproxy/ai-gateway is not served by the module
// proxy this project builds from (go get answers 403), so its own types
// cannot be imported. Its fields that are other projects' types (the
// Gateway API's target reference, Envoy Gateway's client selector) are
// those projects' own Go types, which are imported. Status is left out:
// a manifest does not set it.
type quotaPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		TargetRefs   []gwapiv1a2.LocalPolicyTargetReference `json:"targetRefs,omitempty"`
		ServiceQuota struct {
			CostExpression *string    `json:"costExpression,omitempty"`
			Quota          quotaValue `json:"quota"`
		} `json:"serviceQuota,omitempty"`
		PerModelQuotas []struct {
			ModelName *string `json:"modelName"`
			Quota     struct {
				CostExpression *string    `json:"costExpression,omitempty"`
				Mode           string     `json:"mode,omitempty"`
				DefaultBucket  quotaValue `json:"defaultBucket"`
				BucketRules    []struct {
					ClientSelectors []egv1a1.RateLimitSelectCondition `json:"clientSelectors,omitempty"`
					Quota           quotaValue                        `json:"quota"`
					ShadowMode      *bool                             `json:"shadowMode,omitempty"`
				} `json:"bucketRules,omitempty"`
			} `json:"quota"`
		} `json:"perModelQuotas,omitempty"`
	} `json:"spec,omitempty"`
}

type quotaValue struct {
	Limit    uint   `json:"limit"`
	Duration string `json:"duration"`
}

// The QuotaPolicy of docs/ai-gateways.md decodes strictly into that
// struct, as the API server would take it, and is the shape the manual
// and TestAIGatewayQuotaPolicy (package ratelimit) describe: one
// AIServiceBackend, one model, a default bucket and a tenant's bucket
// chosen by an Exact header, each over a duration AI Gateway's controller
// turns into a rate-limit unit. The manual shows the file as it is.
func TestAIGatewayQuotaPolicyExample(t *testing.T) {
	var p quotaPolicy
	decodeAIExample(t, "quota-policy.yaml", &p)
	if p.APIVersion != "aigateway.envoyproxy.io/v1alpha1" || p.Kind != "QuotaPolicy" {
		t.Fatalf("quota-policy.yaml is a %s %s", p.APIVersion, p.Kind)
	}
	if refs := p.Spec.TargetRefs; len(refs) != 1 || refs[0].Kind != "AIServiceBackend" || refs[0].Group != "aigateway.envoyproxy.io" {
		t.Errorf("targetRefs %+v, want one AIServiceBackend", refs)
	}
	units := map[string]bool{"1s": true, "1m": true, "1h": true, "1d": true}
	if len(p.Spec.PerModelQuotas) != 1 {
		t.Fatalf("%d per-model quotas, want 1", len(p.Spec.PerModelQuotas))
	}
	q := p.Spec.PerModelQuotas[0]
	if q.ModelName == nil || *q.ModelName == "" {
		t.Error("the per-model quota names no model")
	}
	if q.Quota.DefaultBucket.Limit == 0 || !units[q.Quota.DefaultBucket.Duration] {
		t.Errorf("default bucket %+v: want a limit over 1s, 1m, 1h or 1d", q.Quota.DefaultBucket)
	}
	if len(q.Quota.BucketRules) != 1 {
		t.Fatalf("%d bucket rules, want the tenant's", len(q.Quota.BucketRules))
	}
	r := q.Quota.BucketRules[0]
	if !units[r.Quota.Duration] || r.Quota.Limit == 0 || r.Quota.Limit >= q.Quota.DefaultBucket.Limit {
		t.Errorf("tenant bucket %+v: want a smaller limit than the default bucket's, over 1s, 1m, 1h or 1d", r.Quota)
	}
	if len(r.ClientSelectors) != 1 || len(r.ClientSelectors[0].Headers) != 1 ||
		r.ClientSelectors[0].Headers[0].Type == nil || *r.ClientSelectors[0].Headers[0].Type != egv1a1.HeaderMatchExact {
		t.Errorf("tenant bucket selectors %+v: want one Exact header", r.ClientSelectors)
	}
	manualShows(t, "quota-policy.yaml", "apiVersion:")
}
