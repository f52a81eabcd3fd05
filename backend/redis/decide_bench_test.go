package redis

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// BenchmarkDecide runs the decision path of the Redis backend (a real
// redis-server on loopback) and of the memory backend side by side, with
// 32 callers per CPU over 300 buckets (uniform) or one (hot), so that the
// Go side's cost per decision can be profiled apart from gRPC's:
//
//	go test ./backend/redis -run '^$' -bench Decide -cpuprofile cpu.out
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Require(b)
	client, err := Dial(b.Context(), Conn{URL: srv.URL()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(client.Close)
	limits := []bucket.Limit{{Name: "rps", Amount: 1_000_000_000, Period: 1000, Burst: 1_000_000_000}}
	for _, load := range []struct {
		name string
		keys int
	}{{"uniform", 300}, {"hot", 1}} {
		for _, side := range []string{"memory", "redis"} {
			b.Run(load.name+"/"+side, func(b *testing.B) {
				var be backend.Backend
				if side == "memory" {
					m := memory.New(memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
					b.Cleanup(func() { m.Close() })
					be = m
				} else {
					var rtt atomic.Int64
					r, err := New(client, Options{KeyPrefix: "bench", TTLMultiplier: backend.DefaultTTLMultiplier,
						Call: func(ctx context.Context, op string, fn func(context.Context) error) error {
							start := time.Now()
							err := fn(ctx)
							rtt.Add(int64(time.Since(start)))
							return err
						}})
					b.Cleanup(func() {
						if n := r.Stats().Scripts.Load(); n > 0 {
							b.ReportMetric(float64(rtt.Load())/float64(n)/1000, "µs/roundtrip")
							b.ReportMetric(float64(n)/float64(b.N), "scripts/op")
						}
					})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { r.Close() })
					be = r
				}
				var next atomic.Uint64
				b.SetParallelism(32)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						n := next.Add(1)
						req := backend.Request{Entity: "e" + strconv.FormatUint(n%uint64(load.keys), 10), Resource: "r", Defaults: limits, Hits: 1}
						if _, err := be.Decide(ctx, &req); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
