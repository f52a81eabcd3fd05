package main

import (
	"context"
	"fmt"
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

	"github.com/sluice-rl/sluice/backend/bucket"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// The rule file gives every user 20 a minute (a token every 3 s); the
// stores' entity configs give acme 100 an hour (a token every 36 s: a
// store slow for a moment still answers well within a token).
const rulesRemaining = `domain: remaining
descriptors:
  - key: user
    limits:
      - {name: rpm, rate: 20/min}
`

// remainingCase is a fresh key, the limit it resolves to and where that
// limit comes from.
type remainingCase struct {
	name, user    string
	burst, fillMs int64 // fillMs: ms per token
}

// checkExactAnswers makes n sequential calls on c's key, each one hit,
// and checks every answer against one bucket, exactly: after call i
// (1-based) the bucket holds burst-i tokens plus what refilled since the
// first call, and duration_until_reset is the time until it is full
// again (DESIGN section 5: whole seconds, rounded up). The refill and the
// time since are bounded by the time the calls took (elapsed): with calls
// quicker than a token's refill, both answers are exact.
func checkExactAnswers(t *testing.T, client rlsv3.RateLimitServiceClient, c remainingCase, n int) {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "remaining", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: c.user}}}}}
	start := time.Now()
	for i := int64(1); i <= int64(n); i++ {
		resp, err := callWithin(t, client, req)
		elapsed := time.Since(start).Milliseconds()
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: call %d: %v %v", c.name, i, resp, err)
		}
		st := resp.Statuses[0]
		// x, the time from the first decision to this one, is in
		// [0, elapsed]: the bucket holds burst-i+floor(x/fillMs) tokens
		// (below the burst: i > floor(x/fillMs) is checked below), and is
		// full again i*fillMs-x ms from now.
		if elapsed/c.fillMs >= i {
			t.Fatalf("%s: call %d came %d ms after the first: too slow to check exactly", c.name, i, elapsed)
		}
		loR, hiR := c.burst-i, c.burst-i+elapsed/c.fillMs
		loD, hiD := ceilDiv(i*c.fillMs-elapsed, 1000), ceilDiv(i*c.fillMs, 1000)
		got, gotD := int64(st.LimitRemaining), st.DurationUntilReset.GetSeconds()
		if got < loR || got > hiR || gotD < loD || gotD > hiD {
			t.Errorf("%s: call %d (%d ms after the first): limit_remaining %d, duration_until_reset %ds; want %s and %s",
				c.name, i, elapsed, got, gotD, span(loR, hiR), span(loD, hiD))
		}
	}
}

// callWithin calls ShouldRateLimit with a deadline of 10 s: a store's
// first writes on a cold JVM (DynamoDB Local) can take longer than the
// second the service gives a call without one.
func callWithin(t *testing.T, client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return client.ShouldRateLimit(ctx, req)
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// span says lo, or lo to hi.
func span(lo, hi int64) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d to %d", lo, hi)
}

// One replica: limit_remaining and duration_until_reset are exact on
// every backend, leases on (serve's default), from a key's very first
// call, for a limit of the rule files and, on the stores, for an entity
// config read for the first time.
func TestRemainingExactWithOneReplica(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "remaining.yaml"), []byte(rulesRemaining), 0o644); err != nil {
		t.Fatal(err)
	}
	const n = 15
	rule := remainingCase{name: "rule file", user: "plain", burst: 20, fillMs: 3000}
	entity := remainingCase{name: "entity config", user: "acme", burst: 100, fillMs: 36_000}
	t.Run("memory", func(t *testing.T) {
		s, _, _ := startTestServer(t, testOptions(dir))
		checkExactAnswers(t, dial(t, s.grpcLn.Addr().String()), rule, n)
	})
	for _, store := range []struct {
		name string
		open func(*testing.T) opStore
	}{{"dynamodb", newOpTable}, {"redis", newOpRedis}} {
		t.Run(store.name, func(t *testing.T) {
			tb := store.open(t)
			tb.run(t, 0, "limits", "set", "--entity", entity.user, "--resource", "remaining/user", "rpm=100/hour:burst=100")
			o := testOptions(dir)
			tb.serve(&o)
			o.leaseHorizon = testOptions(dir).leaseHorizon // serve's default: leases on
			s, _, _ := startTestServer(t, o)
			client := dial(t, s.grpcLn.Addr().String())
			checkExactAnswers(t, client, rule, n)
			checkExactAnswers(t, client, entity, n)
		})
	}
}

// rulesFleet is a limit that refills a token every 6 minutes: a test of
// a few seconds sees next to no refill, so what the fleet can still admit
// is what the store holds once the leases are back.
const rulesFleet = `domain: fleet
descriptors:
  - key: user
    limits:
      - {name: rpm, rate: 10/hour, burst: 100}
`

// fleetStore is a store two replicas share, and how to read a bucket of
// it as stored: its tokens and clock (ms) of limit rpm.
type fleetStore struct {
	serve func(*serveOptions)
	state func(t *testing.T, user string) (tokens, clock int64)
}

func fleetDynamoDB(t *testing.T) fleetStore {
	srv, _, table := dynamoDBServeEnv(t)
	if out, code := sluice(t, "table", "create", "--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()); code != 0 {
		t.Fatalf("table create: exit %d\n%s", code, out)
	}
	keys, err := ddb.NewKeys("")
	if err != nil {
		t.Fatal(err)
	}
	return fleetStore{
		serve: func(o *serveOptions) {
			o.backend, o.table, o.region, o.endpoint = "dynamodb", table, "us-east-1", srv.Endpoint()
		},
		state: func(t *testing.T, user string) (int64, int64) {
			out, err := srv.Client(t.Context()).GetItem(t.Context(), &dynamodb.GetItemInput{
				TableName: aws.String(table), ConsistentRead: aws.Bool(true),
				Key: map[string]types.AttributeValue{
					"PK": &types.AttributeValueMemberS{Value: keys.EntityPK(user)},
					"SK": &types.AttributeValueMemberS{Value: keys.BucketSK("fleet/user")},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			n := func(attr string) int64 {
				v, ok := out.Item[attr].(*types.AttributeValueMemberN)
				if !ok {
					t.Fatalf("bucket of %s: no %s in %v", user, attr, out.Item)
				}
				x, err := strconv.ParseInt(v.Value, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return x
			}
			return n("b_rpm_tk"), n("b_rpm_rf")
		},
	}
}

func fleetRedis(t *testing.T) fleetStore {
	srv := redistest.Require(t)
	keys, err := redis.NewKeys("")
	if err != nil {
		t.Fatal(err)
	}
	return fleetStore{
		serve: func(o *serveOptions) { o.backend, o.redis.URL = "redis", srv.URL() },
		state: func(t *testing.T, user string) (int64, int64) {
			key := keys.Bucket(user, "fleet/user", "")
			n := func(field string) int64 {
				v, err := srv.Do(t.Context(), "HGET", key, field)
				if err != nil {
					t.Fatalf("HGET %s %s: %v", key, field, err)
				}
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("HGET %s %s: %q: %v", key, field, v, err)
				}
				return x
			}
			return n("b_rpm_tk"), n("b_rpm_rf")
		},
	}
}

// Two replicas on one store, leases on: an answer is what the answering
// replica last saw of the bucket plus its own lease, an estimate. It
// never states more than the fleet could still admit when it was given
// (the store's tokens and every replica's lease together) while the other
// replica has admitted nothing on the key, and never more than that plus
// what the other replica admitted before it: a replica paid from its lease
// does not see the others' spending until its next write, so it can state
// more than is left by that much, and no more (the strict bound is
// logged, not asserted: no answer without a round trip can know it).
// Measured after the fact: once both replicas have stopped and given their
// leases back, the store holds what the fleet can admit; at each answer it
// could admit that, plus the calls admitted after it, less what refilled
// since. Each key sees its calls go to the replicas in its own order.
func TestRemainingWithSeveralReplicas(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fleet.yaml"), []byte(rulesFleet), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := bucket.Spec{Name: "rpm", Rate: "10/hour", Burst: ptrTo(int64(100))}.Limit()
	if err != nil {
		t.Fatal(err)
	}
	orders := map[string]string{ // a: the first replica, b: the second
		"alternating": "abababababababababababab",
		"runs":        "aaaaabbbbbaaaaabbbbbaaaa",
		"pairs":       "aabbaabbaabbaabbaabbaabb",
		"b-late":      "aaaaaaaaaaaabababababbbb",
	}
	for _, store := range []struct {
		name string
		open func(*testing.T) fleetStore
	}{{"dynamodb", fleetDynamoDB}, {"redis", fleetRedis}} {
		t.Run(store.name, func(t *testing.T) {
			st := store.open(t)
			var clients [2]rlsv3.RateLimitServiceClient
			var stops [2]func()
			for i := range 2 {
				o := testOptions(dir)
				st.serve(&o)
				s, stop, done := startTestServer(t, o)
				clients[i] = dial(t, s.grpcLn.Addr().String())
				stops[i] = func() {
					stop()
					if err := <-done; err != nil {
						t.Errorf("replica %d stopped with %v", i, err)
					}
					done <- nil // for the clean-up
				}
			}
			type answer struct {
				remaining int64
				at        time.Time
			}
			answers := map[string][]answer{}
			for user, order := range orders {
				req := &rlsv3.RateLimitRequest{Domain: "fleet", Descriptors: []*rlv3.RateLimitDescriptor{
					{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}}
				for i, r := range order {
					resp, err := callWithin(t, clients[r-'a'], req)
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						t.Fatalf("%s: call %d on replica %c: %v %v", user, i+1, r, resp, err)
					}
					answers[user] = append(answers[user], answer{int64(resp.Statuses[0].LimitRemaining), time.Now()})
				}
			}
			for _, stop := range stops {
				stop() // the leases go back
			}
			end := time.Now()
			for user, as := range answers {
				tk, clock := st.state(t, user)
				fleet := bucket.Refill(l, bucket.State{Tokens: tk, Clock: clock}, end.UnixMilli()).Tokens
				var over []string
				others, most := [2]int64{}, int64(0) // calls admitted by each replica so far; the largest excess
				for i, a := range as {
					r := orders[user][i] - 'a'
					others[r]++
					// What the fleet could admit at the answer: what it can
					// now, plus the calls after it, less the refill since
					// (within a millitoken: whole steps of 360 ms each).
					refill := end.Sub(a.at).Milliseconds() * l.Amount / l.Period
					could := fleet + int64(len(as)-1-i)*bucket.Milli - refill
					excess := a.remaining*bucket.Milli - could
					if excess <= 0 {
						continue
					}
					most = max(most, excess)
					over = append(over, fmt.Sprintf("call %d (replica %c): %d > %.3f", i+1, orders[user][i], a.remaining, float64(could)/bucket.Milli))
					if other := others[1-r]; excess > other*bucket.Milli {
						t.Errorf("%s: call %d on replica %c answered %d remaining, %.3f more than the fleet could admit (%.3f), and the other replica had admitted %d",
							user, i+1, orders[user][i], a.remaining, float64(excess)/bucket.Milli, float64(could)/bucket.Milli, other)
					}
				}
				t.Logf("%s (%s): the store holds %.3f tokens after %d calls and both replicas' stops; %d answers above what the fleet could admit, by %.3f at most\n%s",
					user, orders[user], float64(fleet)/bucket.Milli, len(as), len(over), float64(most)/bucket.Milli, strings.Join(over, "\n"))
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }
