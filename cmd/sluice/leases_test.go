package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A limit far above the traffic and slow to refill (a token every 86 s),
// so the test can count its tokens exactly.
const rulesLeased = `domain: leased
descriptors:
  - key: user
    limits:
      - {name: daily, rate: 1000/day}
`

// serve leases by default: a hundred decisions on one key cost a few
// writes, the lease shows on /metrics and /debug/config, and a graceful
// stop gives the lease back, so the table then holds the tokens not
// admitted (and what refilled meanwhile). With --lease-horizon 0 every allowed decision writes; a
// negative horizon is a usage error.
func TestServeLeases(t *testing.T) {
	srv, dir, table := dynamoDBServeEnv(t)
	if err := os.WriteFile(filepath.Join(dir, "leased.yaml"), []byte(rulesLeased), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := sluice(t, "serve", "--backend", "dynamodb", "--table", table, "--config-dir", dir, "--lease-horizon", "-1s"); code != 2 || !strings.Contains(out, "--lease-horizon") {
		t.Fatalf("negative --lease-horizon: exit %d\n%s", code, out)
	}
	if out, code := sluice(t, "table", "create", "--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()); code != 0 {
		t.Fatalf("table create: exit %d\n%s", code, out)
	}
	const n = 100
	for _, c := range []struct {
		user    string
		horizon string
	}{{"leased", ""}, {"unleased", "0s"}} {
		o := testOptions(dir)
		o.backend, o.table, o.region, o.endpoint = "dynamodb", table, "us-east-1", srv.Endpoint()
		if c.horizon == "0s" {
			o.leaseHorizon = 0
		}
		s, stop, done := startTestServer(t, o)
		client := dial(t, s.grpcLn.Addr().String())
		start := time.Now()
		req := &rlsv3.RateLimitRequest{Domain: "leased", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: c.user}}}}}
		for i := range n {
			resp, err := client.ShouldRateLimit(t.Context(), req)
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s call %d: %v %v", c.user, i, resp, err)
			}
			if got, want := resp.Statuses[0].LimitRemaining, uint32(1000-1-i); got != want {
				t.Fatalf("%s call %d: limit_remaining %d, want %d (one replica: exact)", c.user, i, got, want)
			}
		}
		got, raw := scrape(t, s)
		writes := got[`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=UpdateItem}`] +
			got[`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=PutItem}`]
		leased := got[`sluice_dynamodb_lease_tokens_total{event=leased}`]
		t.Logf("%s: %d decisions, %v writes, %v tokens leased", c.user, n, writes, leased)
		if c.horizon == "" {
			if writes > n/4 || leased == 0 || got[`sluice_dynamodb_local_answers_total{}`] < n/2 {
				t.Errorf("with leases: %v writes, %v leased for %d decisions\n%s", writes, leased, n, raw)
			}
			if v := s.describe().DynamoDB; v == nil || v.Leases.Horizon != "30s" || v.Leases.Leased == 0 {
				t.Errorf("/debug/config shows no leases: %+v", v)
			}
			checkMetricsDocumented(t, got, "dynamodb")
		} else if writes != n || leased != 0 {
			t.Errorf("--lease-horizon 0: %v writes and %v leased for %d decisions", writes, leased, n)
		}
		stop()
		<-done
		done <- nil // for the clean-up
		item, err := srv.Client(t.Context()).GetItem(t.Context(), &dynamodb.GetItemInput{
			TableName: aws.String(table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{
				"PK": &types.AttributeValueMemberS{Value: "ENTITY#" + c.user},
				"SK": &types.AttributeValueMemberS{Value: "#BUCKET#leased/user"},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		// 1000/day refills a millitoken every 86.4 ms: a slow run sees a
		// few come back on top of the 900 tokens not admitted. A lease not
		// given back would leave hundreds of tokens fewer.
		refill := time.Since(start).Milliseconds()/86 + 1
		tk, _ := item.Item["b_daily_tk"].(*types.AttributeValueMemberN)
		held := int64(-1)
		if tk != nil {
			held, _ = strconv.ParseInt(tk.Value, 10, 64)
		}
		if held < 900000 || held > 900000+refill {
			t.Errorf("%s: after a graceful stop the bucket holds %d millitokens, want 900000 (plus at most %d refilled)", c.user, held, refill)
		}
	}
}
