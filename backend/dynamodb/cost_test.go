package dynamodb

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
)

// BenchmarkDecisionCost reports what one decision costs in DynamoDB calls
// and capacity units, against DynamoDB Local:
//
//	go test -run '^$' -bench DecisionCost -benchtime 200x ./backend/dynamodb/
//
// warm: a known bucket with tokens, leases off (one UpdateItem, no read);
// leased: the same with leases on (most decisions paid from the lease,
// renewals in the background); cold: a new entity each time (config
// records read, bucket created); denied: an exhausted bucket seen within
// the staleness bound (no call); cascade: a warm child and parent, leases
// off (one transaction).
func BenchmarkDecisionCost(b *testing.B) {
	srv := dynamodbtest.Require(b)
	table := srv.NewTable(b, func(ctx context.Context, c *dynamodb.Client, name string) error {
		_, err := CreateTable(ctx, c, name)
		return err
	})
	newBackend := func(b *testing.B, leases bool) *Backend {
		horizon := time.Duration(-1)
		if leases {
			horizon = 0 // the default
		}
		be, err := New(srv.Client(context.Background()), Options{Table: table, TTLMultiplier: 7, LeaseHorizon: horizon})
		if err != nil {
			b.Fatal(err)
		}
		return be
	}
	roomy := []bucket.Limit{{Name: "x", Amount: 1e9 * bucket.Milli, Period: bucket.Second, Burst: 1e9 * bucket.Milli}}
	tight := []bucket.Limit{{Name: "x", Amount: bucket.Milli, Period: bucket.Hour, Burst: bucket.Milli}}
	cases := []struct {
		name         string
		req          func(i int) backend.Request
		warm, leases bool
	}{
		{"warm", func(int) backend.Request {
			return backend.Request{Entity: "w", Resource: "r", Defaults: roomy, Hits: 1}
		}, true, false},
		{"leased", func(int) backend.Request {
			return backend.Request{Entity: "l", Resource: "r", Defaults: roomy, Hits: 1}
		}, true, true},
		{"cold", func(i int) backend.Request {
			return backend.Request{Entity: "c" + strconv.Itoa(i), Resource: "r", Defaults: roomy, Hits: 1}
		}, false, false},
		{"denied", func(int) backend.Request {
			return backend.Request{Entity: "d", Resource: "r", Defaults: tight, Hits: 1}
		}, true, false},
		{"cascade", func(int) backend.Request {
			return backend.Request{Entity: "k", Parent: "p", Resource: "r", Defaults: roomy, Hits: 1}
		}, true, false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			be := newBackend(b, c.leases)
			defer be.Close()
			ctx := context.Background()
			if c.warm {
				// Warm up: config cached, bucket known (and, for denied,
				// exhausted).
				for i := 0; i < 2; i++ {
					req := c.req(-1)
					if _, err := be.Decide(ctx, &req); err != nil {
						b.Fatal(err)
					}
				}
			}
			calls0 := totalCalls(be)
			r0, w0 := be.Stats().ReadMilliUnits.Load(), be.Stats().WriteMilliUnits.Load()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := c.req(i)
				if _, err := be.Decide(ctx, &req); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64(totalCalls(be)-calls0)/n, "calls/op")
			b.ReportMetric(float64(be.Stats().ReadMilliUnits.Load()-r0)/1000/n, "RCU/op")
			b.ReportMetric(float64(be.Stats().WriteMilliUnits.Load()-w0)/1000/n, "WCU/op")
		})
	}
}

func totalCalls(b *Backend) uint64 {
	calls, _ := b.Stats().Calls()
	var n uint64
	for _, c := range calls {
		n += c
	}
	return n
}

// BenchmarkDecisionAtTheLimitFar reports what a decision costs a replica
// in CPU and allocations on a key at its limit whose table is farther
// than the callers' deadline (70 ms against 50 ms): every call is paid
// from the lease or denied here, from the bucket as last seen or at its
// deadline, while renewals go out in the background.
//
//	go test -run '^$' -bench DecisionAtTheLimitFar -benchtime 3s ./backend/dynamodb/
func BenchmarkDecisionAtTheLimitFar(b *testing.B) {
	srv := dynamodbtest.Require(b)
	table := srv.NewTable(b, func(ctx context.Context, c *dynamodb.Client, name string) error {
		_, err := CreateTable(ctx, c, name)
		return err
	})
	be, err := New(slowWrites{srv.Client(context.Background()), 70 * time.Millisecond},
		Options{Table: table, TTLMultiplier: 7})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	l := bucket.Limit{Name: "x", Amount: 500 * bucket.Milli, Period: bucket.Second, Burst: 500 * bucket.Milli}
	req := backend.Request{Entity: "far", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	if _, err := be.Decide(context.Background(), &req); err != nil {
		b.Fatal(err)
	}
	var allowed, failed atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(50)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			r := req
			d, err := be.Decide(ctx, &r)
			cancel()
			switch {
			case err != nil:
				failed.Add(1)
			case d.Allowed:
				allowed.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "failed/op")
}
