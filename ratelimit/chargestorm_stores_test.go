package ratelimit_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	rds "github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/ratelimit"
)

// storeFleet is three Sluice replicas on one store, each served over
// gRPC, and a reader of the bucket as the store keeps it.
type storeFleet struct {
	clients []rlsv3.RateLimitServiceClient
	stored  func(ctx context.Context, entity, resource string) (backend.Bucket, bool, error)
}

// The gateways' storms of TestGatewayChargeStorms on the stores: three
// replicas with leases, 5 ms from DynamoDB Local, or on one redis-server
// with every call 5 ms longer, for 3 s (backendtest.ChargeRunEnv and
// ChargeDelayEnv change both, as `make bench-charges` does), each client
// on one replica for its checks and its charges alike, as Envoy behind a
// ClusterIP Service sends a request's two calls over one connection. The
// tokens admitted requests used stay within [0.8, 1] of B + R*T with the
// K*N of requests in flight, and the store counts every charge.
//
// With SLUICE_CROSS_REPLICA_CHARGES=1 each client's charges go to the
// replica after its checks' instead, as per-request load balancing over
// the replicas may send them. That is a known gap, not held: a replica
// goes on admitting from its lease until its view of the others'
// charges is refreshed, and in three runs one storm went past 1.25 of
// B + R*T on each store (1.48 on DynamoDB, 2.19 on Redis; docs/ai-gateways.md,
// "A request's check and charge on different replicas").
func TestGatewayChargeStormsOnTheStores(t *testing.T) {
	if testing.Short() {
		t.Skip("six storms of 3 s on DynamoDB Local and redis-server")
	}
	shift := 0
	if os.Getenv("SLUICE_CROSS_REPLICA_CHARGES") == "1" {
		shift = 1
	}
	for _, store := range []struct {
		name  string
		fleet func(t *testing.T, prefix string) storeFleet
	}{
		{"DynamoDB", dynamoFleet},
		{"Redis", redisFleet},
	} {
		t.Run(store.name, func(t *testing.T) {
			for i, g := range gatewayPatterns() {
				t.Run(g.name, func(t *testing.T) {
					f := store.fleet(t, "storm"+string(rune('a'+i)))
					for _, c := range f.clients {
						warmUp(t, c)
					}
					var ds []backendtest.Decider
					for k, c := range f.clients {
						ds = append(ds, gatewayCalls{c: c, check: g.check, taken: g.taken, charger: f.clients[(k+shift)%len(f.clients)]})
					}
					load := backendtest.ChargeLoad{Clients: 10, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
					r := backendtest.ChargeStorm(ds, backend.Request{}, load)
					l := bucket.Limit{Name: "tpm", Amount: 1000 * bucket.Milli, Period: bucket.Second, Burst: 1000 * bucket.Milli}
					r.HoldsTheBound(t, l, load)
					bk, ok, err := f.stored(context.Background(), "t1", "llm/tenant")
					if err != nil || !ok {
						t.Fatalf("reading the tenant's bucket (entity t1, resource llm/tenant): found %v, %v", ok, err)
					}
					r.Counted(t, bk.States[0].Consumed, load)
				})
			}
		})
	}
}

// dynamoFleet is three replicas on a new table of the package's DynamoDB
// Local, backendtest.ChargeDelay away behind a delay proxy.
func dynamoFleet(t *testing.T, prefix string) storeFleet {
	srv := dynamodbtest.Require(t)
	table := srv.NewTable(t, func(ctx context.Context, c *dynamodb.Client, name string) error {
		_, err := ddb.CreateTable(ctx, c, name)
		return err
	})
	proxy, err := dynamodbtest.NewProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.SetDelay(backendtest.ChargeDelay(t))
	var f storeFleet
	for range 3 {
		be, err := ddb.New(srv.ClientAt(proxy.Endpoint()), ddb.Options{Table: table, KeyPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		f.clients = append(f.clients, serve(t, ratelimit.New(rules(t, stormRules), be, ratelimit.Options{})))
	}
	admin, err := ddb.NewAdmin(srv.Client(context.Background()), table, prefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.stored = admin.GetBucket
	return f
}

// redisFleet is three replicas on the package's redis-server, each
// round trip backendtest.ChargeDelay longer.
func redisFleet(t *testing.T, prefix string) storeFleet {
	srv := redistest.Require(t)
	dial := func() rueidis.Client {
		c, err := rds.Dial(context.Background(), rds.Conn{URL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	delay := backendtest.ChargeDelay(t)
	far := func(ctx context.Context, _ string, fn func(context.Context) error) error {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		return fn(ctx)
	}
	var f storeFleet
	for range 3 {
		be, err := rds.New(dial(), rds.Options{KeyPrefix: prefix, LeaseHorizon: 30 * time.Second, Call: far})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		f.clients = append(f.clients, serve(t, ratelimit.New(rules(t, stormRules), be, ratelimit.Options{})))
	}
	admin, err := rds.NewAdmin(dial(), prefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.stored = admin.GetBucket
	return f
}

// warmUp has c answer a call on another tenant than the storm's, trying
// again while it cannot within its deadline: a cold emulator's first
// writes can outlast the storm's 1 s deadline (3 of a storm's calls
// failed so in CI, and beside two busy loops, with DynamoDB Local 8 s
// to start, so did a single warm-up call), which is no part of the
// bound under test.
func warmUp(t *testing.T, c rlsv3.RateLimitServiceClient) {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", "warm-up")}}
	var err error
	for range 10 {
		if _, err = c.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.Unavailable {
			break
		}
	}
	if err != nil {
		t.Fatalf("warming a replica up: %v", err)
	}
}
