package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
)

// soakDuration is how long TestSoak runs its traffic; `make soak` sets it
// (SOAK_DURATION). The default, used by `make test`, injects every fault
// once.
var soakDuration = flag.Duration("soak.duration", 30*time.Second, "how long TestSoak runs mixed traffic with faults")

const soakRules = `domain: soak
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 300}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
`

// soakCall is one call of the soak and what it got.
type soakCall struct {
	start   time.Time
	took    time.Duration
	code    codes.Code
	resp    *rlsv3.RateLimitResponse
	buckets []string // entity/resource of each descriptor, "" when not limited
	hits    []uint64
	refund  []bool
}

// soakRequest draws one request of the mix: mostly per-user traffic,
// a hot key at its limit, a tight per-IP limit that mostly denies,
// multi-descriptor calls with an unlimited one, refunds, and bad input.
func soakRequest(rng *rand.Rand) (*rlsv3.RateLimitRequest, soakCall) {
	var c soakCall
	desc := func(key, value string, hits uint64, refund bool) *rlv3.RateLimitDescriptor {
		d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
			HitsAddend: wrapperspb.UInt64(hits), IsNegativeHits: refund}
		bucket := value + "|soak/" + key
		if key == "free" {
			bucket = ""
		}
		c.buckets, c.hits, c.refund = append(c.buckets, bucket), append(c.hits, hits), append(c.refund, refund)
		return d
	}
	req := &rlsv3.RateLimitRequest{Domain: "soak"}
	switch n := rng.IntN(100); {
	case n < 52:
		req.Descriptors = append(req.Descriptors, desc("user", fmt.Sprintf("u%d", rng.IntN(200)), uint64(1+rng.IntN(3)), false))
	case n < 55:
		req.Descriptors = append(req.Descriptors, desc("user", fmt.Sprintf("u%d", rng.IntN(200)), 1, true))
	case n < 75:
		req.Descriptors = append(req.Descriptors, desc("hot", "h", 1, false))
	case n < 85:
		req.Descriptors = append(req.Descriptors, desc("ip", fmt.Sprintf("10.0.0.%d", rng.IntN(20)), 1, false))
	case n < 95:
		req.Descriptors = append(req.Descriptors, desc("user", fmt.Sprintf("u%d", rng.IntN(200)), 1, false), desc("free", "x", 1, false))
	default:
		req.Descriptors = []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "", Value: "bad"}}}}
		c.buckets, c.hits, c.refund = nil, nil, nil
	}
	return req, c
}

// kind names how a call was answered, for the summary.
func (c soakCall) kind() string {
	switch {
	case c.code != codes.OK:
		return c.code.String()
	case c.buckets == nil:
		return "OK?"
	}
	for i, st := range c.resp.Statuses {
		if c.buckets[i] != "" && st.CurrentLimit == nil {
			return "failure policy " + strings.ToLower(c.resp.OverallCode.String())
		}
	}
	return "decided " + strings.ToLower(c.resp.OverallCode.String())
}

// TestSoak runs mixed traffic against two replicas on DynamoDB Local while
// it injects, in turn, every fault the outage tests cover one by one: a
// slow network, latency past the deadline, a partition, DynamoDB Local
// killed and restarted, a replica killed (SIGKILL) and restarted, and a
// broken rule file. Then it reads every bucket back and checks the
// invariants and that every token callers were admitted left its bucket
// (its consumed total). It prints a summary. `make soak` runs it longer,
// with leases on, as serve runs by default.
func TestSoak(t *testing.T) {
	srv := dynamodbtest.RequireOwn(t, dynamodbtest.Options{Dir: memoryDir(t)})
	awsEnv(t)
	t.Setenv("AWS_MAX_ATTEMPTS", "")
	table := dynamodbtest.TableName(t)
	if _, err := ddb.CreateTable(t.Context(), srv.Client(t.Context()), table); err != nil {
		t.Fatal(err)
	}
	proxy, err := dynamodbtest.NewProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "soak.yaml")
	if err := os.WriteFile(rulesFile, []byte(soakRules), 0o644); err != nil {
		t.Fatal(err)
	}
	// No bucket expires during the run (--ttl-multiplier 0), so each
	// bucket's consumed total counts every admission since the start.
	common := []string{"--ttl-multiplier", "0", "--config-dir", dir, "--backend", "dynamodb", "--table", table, "--region", "us-east-1", "--endpoint", proxy.Endpoint()}
	local := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}
	replicas := []*serveProcess{
		startServeProcess(t, slices.Concat(local, common, []string{"--on-backend-error", "error"})...),
		startServeProcess(t, slices.Concat(local, common, []string{"--on-backend-error", "deny"})...),
	}
	clients := make([]rlsv3.RateLimitServiceClient, len(replicas))
	for i, r := range replicas {
		clients[i] = dial(t, r.addrs["grpc"])
	}

	// The traffic: 12 workers, each bound to a replica, paced to about 200
	// calls a second, which DynamoDB Local on disk keeps up with on two
	// busy cores when nothing is broken: the soak is about faults, not
	// about overload.
	var mu sync.Mutex
	var calls []soakCall
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			client := clients[w%len(clients)]
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(40+rng.IntN(40)) * time.Millisecond):
				}
				req, c := soakRequest(rng)
				ctx, cancel := context.WithTimeout(context.Background(), outageDeadline)
				c.start = time.Now()
				resp, err := client.ShouldRateLimit(ctx, req)
				c.took, c.code, c.resp = time.Since(c.start), status.Code(err), resp
				cancel()
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		}()
	}

	// The faults, in turn, each followed by a calm spell, until the time is
	// up; the last spell is calm, so the run ends on a working system.
	faults := []struct {
		name   string
		inject func()
		mend   func()
	}{
		{"network 30 ms slower", func() { proxy.SetDelay(30 * time.Millisecond) }, func() { proxy.SetDelay(0) }},
		{"network slower than the deadline", func() { proxy.SetDelay(2 * outageDeadline) }, func() { proxy.SetDelay(0) }},
		{"network partition", proxy.Partition, proxy.Heal},
		{"DynamoDB Local killed", srv.Kill, func() {
			if err := srv.Restart(context.Background()); err != nil {
				t.Error(err)
			}
		}},
		{"replica killed", replicas[0].kill, func() { replicas[0].restart(t) }},
		{"rule file broken", func() {
			os.WriteFile(rulesFile, []byte("domain: soak\ndescriptors: [\n"), 0o644)
		}, func() { os.WriteFile(rulesFile, []byte(soakRules), 0o644) }},
	}
	injected := map[string]int{}
	begin := time.Now()
	for i := 0; time.Since(begin) < *soakDuration || i < len(faults); i++ {
		time.Sleep(1500 * time.Millisecond) // calm
		f := faults[i%len(faults)]
		f.inject()
		time.Sleep(1500 * time.Millisecond)
		f.mend()
		injected[f.name]++
	}
	// Calm: decisions resume within 2 s of the last fault's end (the
	// outage tests' bound), and the 2 s after that are checked. A
	// restarted DynamoDB Local has ended its fault once its writes fit
	// in half a call's deadline again (see serving), which can take it
	// many seconds on a busy machine: beside two busy loops and the rest
	// of the suite, one took over a minute to answer five in a row within
	// 100 ms, the last in 287 ms, with the soak's traffic on it.
	mended := serving(t, srv, table, outageDeadline/2)
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()

	// What callers got.
	kinds := map[string]int{}
	var tooks []time.Duration
	late := 0
	okHits := map[string]uint64{}      // admitted by a decision the caller saw
	unknownHits := map[string]uint64{} // decisions whose answer a fault took
	for _, c := range calls {
		kinds[c.kind()]++
		tooks = append(tooks, c.took)
		if c.code == codes.DeadlineExceeded || c.took >= outageDeadline {
			late++
		}
		for i, b := range c.buckets {
			if b == "" || c.refund[i] {
				continue
			}
			switch {
			case c.code == codes.OK && c.resp.Statuses[i].CurrentLimit != nil:
				if c.resp.Statuses[i].Code == rlsv3.RateLimitResponse_OK {
					okHits[b] += c.hits[i]
				}
			case c.code != codes.InvalidArgument:
				unknownHits[b] += c.hits[i]
			}
		}
	}
	slices.Sort(tooks)
	// Invalid input is answered INVALID_ARGUMENT whatever happens: it
	// says nothing of recovery.
	var recent []soakCall
	recovered := 0
	for _, c := range calls {
		if c.start.Before(mended.Add(2*time.Second)) || c.code == codes.InvalidArgument {
			continue
		}
		recent = append(recent, c)
		if strings.HasPrefix(c.kind(), "decided") {
			recovered++
		}
	}

	// What the table holds.
	a, err := ddb.NewAdmin(srv.Client(t.Context()), table, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var violations []string
	buckets, limits := 0, 0
	consumed := map[string]uint64{}
	if err := a.AllBuckets(t.Context(), func(b backend.Bucket) error {
		buckets++
		limits += len(b.Limits)
		violations = append(violations, b.Violations(time.Now().UnixMilli(), 0)...)
		consumed[b.Entity+"|"+b.Resource] = uint64(b.States[0].Consumed / 1000)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for b := range okHits {
		if _, ok := consumed[b]; !ok {
			consumed[b] = 0
		}
	}
	accounted := 0
	for b, tc := range consumed {
		accounted++
		// Every admitted token left its bucket first, and was counted
		// then. Leases (on by default) also count tokens taken ahead and
		// never spent, returned or lost with a killed replica, so the
		// total has no upper bound beyond the limits themselves.
		if tc < okHits[b] {
			violations = append(violations, fmt.Sprintf("bucket %s consumed %d: callers were admitted %d (%d more were in flight through faults)",
				b, tc, okHits[b], unknownHits[b]))
		}
	}

	var sum strings.Builder
	fmt.Fprintf(&sum, "soak summary: %v of traffic, 2 replicas, DynamoDB Local behind a fault proxy\n", time.Since(begin).Round(time.Second))
	fmt.Fprintf(&sum, "  calls: %d (deadline %v)\n", len(calls), outageDeadline)
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&sum, "    %-32s %7d\n", k, kinds[k])
	}
	fmt.Fprintf(&sum, "  latency: p50 %v, p99 %v, max %v; %d answered late\n", tooks[len(tooks)/2].Round(time.Microsecond),
		tooks[len(tooks)*99/100].Round(time.Microsecond), tooks[len(tooks)-1].Round(time.Microsecond), late)
	fmt.Fprintf(&sum, "  faults injected: ")
	for _, f := range faults {
		fmt.Fprintf(&sum, "%s x%d; ", f.name, injected[f.name])
	}
	fmt.Fprintf(&sum, "\n  from 2 s after the last fault: %d of %d valid calls decided normally\n", recovered, len(recent))
	fmt.Fprintf(&sum, "  invariants: %d buckets, %d limit states read back; %d buckets' consumption checked against callers; %d violations\n",
		buckets, limits, accounted, len(violations))
	t.Log(sum.String())

	for _, v := range violations {
		t.Error(v)
	}
	if buckets == 0 || accounted == 0 {
		t.Error("no buckets to audit: the traffic did not reach DynamoDB")
	}
	if len(recent) == 0 || recovered < len(recent)*9/10 {
		t.Errorf("only %d of %d valid calls were decided normally from 2 s after the last fault", recovered, len(recent))
	}
	// Calls are answered within their deadline whatever breaks; a machine
	// this busy (two replicas, DynamoDB Local and the load on two cores)
	// may still miss a few by scheduling alone.
	if late > len(calls)/100 {
		t.Errorf("%d of %d calls answered after their deadline", late, len(calls))
	}
	if t.Failed() {
		for i, r := range replicas {
			out := r.out.String()
			t.Logf("replica %d's last output:\n%s", i, out[max(0, len(out)-3000):])
		}
	}
}
