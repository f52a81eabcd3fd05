package rlqs_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/backend"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	"github.com/sluice-rl/sluice/backend/memory"
	rds "github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/rlqs/rlqstest"
)

type staticRules struct{ cfg *descriptors.Config }

func (r staticRules) Current() *descriptors.Config { return r.cfg }

// rules is one domain, "quota", whose bucket {api: <any>} is limited to
// rate a second with a burst of as much.
func rules(t testing.TB, rate int) staticRules {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"quota.yaml": fmt.Appendf(nil, `
domain: quota
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: %d}
`, rate)})
	if err != nil {
		t.Fatal(err)
	}
	return staticRules{cfg}
}

// replica serves a quota service over be on a loopback port and returns
// a connection to it.
func replica(t testing.TB, r rlqs.Rules, be backend.Backend) (*rlqs.Service, *grpc.ClientConn) {
	t.Helper()
	svc := rlqs.New(r, be, rlqs.Options{})
	srv := grpc.NewServer()
	rlqs.Register(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return svc, conn
}

// fleet is Envoys sending paced requests into one bucket, each at a
// demand that may change while it runs, and counting per second what
// their filters admitted.
type fleet struct {
	envoys  []*rlqstest.Filter
	demand  []atomic.Int64 // requests a second
	start   time.Time
	seconds int
	mu      sync.Mutex
	allowed [][]uint64 // [envoy][second]
	asked   [][]uint64
}

var bucketID = map[string]string{"api": "search"}

// long runs the fleets for 60 s and holds them to DESIGN section 15's
// targets (make soak); make test runs them for 30 s, with looser checks
// on what the shorter run leaves to transients.
var long = flag.Bool("rlqs.long", false, "run the quota fleets for 60 s against the full targets (make soak)")

// fleetSeconds is how long a fleet runs, and floor the part of the limit
// it must admit outside the reporting intervals after its start and its
// shift.
func fleetSeconds() (seconds int, floor float64) {
	if *long {
		return 60, 0.9
	}
	return 30, 0.8
}

// newFleet dials n Envoys, spread over conns in turn, that run for
// seconds.
func newFleet(t testing.TB, conns []*grpc.ClientConn, n, seconds int) *fleet {
	t.Helper()
	f := &fleet{demand: make([]atomic.Int64, n), seconds: seconds}
	for i := range n {
		e, err := rlqstest.Dial(context.Background(), conns[i%len(conns)], rlqstest.Options{
			Domain: "quota", NoAssignment: rlqstest.DenyAll, Expired: rlqstest.DenyAll})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		f.envoys = append(f.envoys, e)
		f.allowed = append(f.allowed, make([]uint64, seconds+1))
		f.asked = append(f.asked, make([]uint64, seconds+1))
	}
	return f
}

// run sends each Envoy's demand every 10 ms until the run ends; at
// changes the demands (phase: seconds from the start).
func (f *fleet) run(changes func(second int)) {
	f.start = time.Now()
	var wg sync.WaitGroup
	for i, e := range f.envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			var owed float64
			last := time.Now()
			for now := range tick.C {
				sec := int(now.Sub(f.start) / time.Second)
				if sec >= f.seconds {
					return
				}
				owed += float64(f.demand[i].Load()) * now.Sub(last).Seconds()
				last = now
				var ok, n uint64
				for ; owed >= 1; owed-- {
					n++
					if e.Request(bucketID) {
						ok++
					}
				}
				f.mu.Lock()
				f.allowed[i][sec] += ok
				f.asked[i][sec] += n
				f.mu.Unlock()
			}
		}()
	}
	for sec := range f.seconds {
		changes(sec)
		time.Sleep(time.Until(f.start.Add(time.Duration(sec+1) * time.Second)))
	}
	wg.Wait()
}

// admitted sums what Envoys admitted over seconds [from, to).
func (f *fleet) admitted(envoys []int, from, to int) uint64 {
	var n uint64
	for _, i := range envoys {
		for s := from; s < to; s++ {
			n += f.allowed[i][s]
		}
	}
	return n
}

func all(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// shiftingDemand runs DESIGN section 15's fleet: ten Envoys asking 1.5
// times a limit of 1,000 a second (burst 1,000) between them, 70/20/10,
// envoy 0 the heavy one until the middle of the run and envoy 9 after.
// It checks the bound over the whole run, what was admitted from the
// first report on, and that the new heavy Envoy has its share two
// reporting intervals after the shift.
func shiftingDemand(t *testing.T, conns []*grpc.ClientConn, services ...*rlqs.Service) {
	const rate, n = 1000, 10
	seconds, floor := fleetSeconds()
	f := newFleet(t, conns, n, seconds)
	shift := seconds / 2
	set := func(heavy int) {
		for i := range n {
			f.demand[i].Store(19)
		}
		f.demand[1].Store(1500 * 0.2)
		f.demand[heavy].Store(1500 * 0.7)
	}
	f.run(func(sec int) {
		switch sec {
		case 0:
			set(0)
		case shift:
			set(9)
		}
	})
	elapsed := time.Since(f.start).Seconds()
	total := f.admitted(all(n), 0, seconds)
	bound := uint64(rate + rate*elapsed + 1)
	var leased, stranded uint64
	for _, s := range services {
		st := s.Stats()
		leased += st.Leased
		stranded += st.Stranded
	}
	t.Logf("admitted %d in %.1f s (bound %d: %.3f of it); tokens leased %d", total, elapsed, bound, float64(total)/float64(bound), leased)
	if total > bound {
		t.Errorf("admitted %d, over the bound B + R*T + 1 = %d", total, bound)
	}
	// Demand always exceeds the limit. For one reporting interval after
	// the start and after the shift, Sluice cannot know it (an Envoy
	// tells its demand only in its reports): those intervals are left
	// out.
	known := f.admitted(all(n), 5, shift) + f.admitted(all(n), shift+5, seconds)
	span := seconds - 10
	t.Logf("admitted %.3f of the limit outside the reporting intervals after the start and the shift", float64(known)/float64(rate*span))
	if want := floor * float64(rate*span); float64(known) < want {
		t.Errorf("admitted %d outside the first reporting intervals, under %.2f of the limit (%.0f)", known, floor, want)
	}
	// The heavy Envoy's share after the shift: the limit less what the
	// others ask (max-min), within two reporting intervals.
	others := uint64(0)
	for i := range n - 1 {
		others += uint64(f.demand[i].Load())
	}
	share := float64(rate) - float64(others)
	from := shift + 10
	got := float64(f.admitted([]int{9}, from, seconds)) / float64(seconds-from)
	t.Logf("after the shift, envoy 9 admitted %.0f/s (its share %.0f/s); envoy 0 %.0f/s",
		got, share, float64(f.admitted([]int{0}, from, seconds))/float64(seconds-from))
	if got < 0.8*share {
		t.Errorf("envoy 9 admitted %.0f a second from two reporting intervals after the shift, under 0.8 of its share %.0f", got, share)
	}
}

// TestFleetOnOneReplica is the fleet on the memory backend.
func TestFleetOnOneReplica(t *testing.T) {
	t.Parallel()
	be := memory.New(memory.Options{})
	defer be.Close()
	svc, conn := replica(t, rules(t, 1000), be)
	shiftingDemand(t, []*grpc.ClientConn{conn}, svc)
}

// TestFleetOnDynamoDB is the fleet on three replicas sharing one table
// 5 ms away (DynamoDB Local behind a delay proxy).
func TestFleetOnDynamoDB(t *testing.T) {
	t.Parallel()
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
	proxy.SetDelay(5 * time.Millisecond)
	var conns []*grpc.ClientConn
	var svcs []*rlqs.Service
	for range 3 {
		be, err := ddb.New(srv.ClientAt(proxy.Endpoint()), ddb.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		svc, conn := replica(t, rules(t, 1000), be)
		conns, svcs = append(conns, conn), append(svcs, svc)
	}
	shiftingDemand(t, conns, svcs...)
}

// TestFleetOnRedis is the fleet on three replicas sharing one Redis.
func TestFleetOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Require(t)
	var conns []*grpc.ClientConn
	var svcs []*rlqs.Service
	for range 3 {
		client, err := rds.Dial(context.Background(), rds.Conn{URL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
		be, err := rds.New(client, rds.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		svc, conn := replica(t, rules(t, 1000), be)
		conns, svcs = append(conns, conn), append(svcs, svc)
	}
	shiftingDemand(t, conns, svcs...)
}
