package examples

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
)

// The token policy of docs/ai-gateways.md decodes strictly into Envoy
// Gateway's BackendTrafficPolicy, as the API server would take it, and
// is the one whose calls Sluice counts as a check and then a charge: a
// cost of nothing at request time (without it every request would also
// take a token as it arrives) and Envoy AI Gateway's token count when the
// response ends. The manual shows the file as it is.
func TestAIGatewayTokenPolicy(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("ai-gateways", "token-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yamlToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var p egv1a1.BackendTrafficPolicy
	if err := strictJSON(js, &p); err != nil {
		t.Fatalf("token-policy.yaml: %v", err)
	}
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

	doc, err := os.ReadFile(filepath.Join("..", "docs", "ai-gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The manual's copy starts at apiVersion: the file's header comment
	// is the file's own.
	body := string(raw[strings.Index(string(raw), "apiVersion:"):])
	if !strings.Contains(string(doc), "```yaml\n"+body+"```") {
		t.Error("docs/ai-gateways.md does not show examples/ai-gateways/token-policy.yaml as it is")
	}
}
