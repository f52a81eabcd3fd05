package redis

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// dialServer connects to srv as serve does, for the test's lifetime.
func dialServer(tb testing.TB, srv *redistest.Server) rueidis.Client {
	tb.Helper()
	client, err := Dial(tb.Context(), Conn{URL: srv.URL()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(client.Close)
	return client
}

// BenchmarkDecide runs the decision path of the Redis backend (a real
// redis-server on loopback) and of the memory backend side by side, with
// 32 callers per CPU over 300 buckets (uniform) or one (hot), so that the
// Go side's cost per decision can be profiled apart from gRPC's:
//
//	go test ./backend/redis -run '^$' -bench Decide -cpuprofile cpu.out
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Require(b)
	client := dialServer(b, srv)
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
					for pb.Next() {
						n := next.Add(1)
						req := backend.Request{Entity: "e" + strconv.FormatUint(n%uint64(load.keys), 10), Resource: "r", Defaults: limits, Hits: 1}
						// A deadline on every call, as the service gives
						// every call one.
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						_, err := be.Decide(ctx, &req)
						cancel()
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkScript runs one run of the decision script at a time on a
// batch of 16 groups, each one allowed decision on a bucket of its own
// with one limit, the shape of a busy replica's batch on many keys. Beside
// the round trip (ns/op) it reports Redis's own time in the script
// (usec_per_call of EVALSHA), which is what a run costs the Redis every
// replica shares. "commands" is the floor: a script that only reads,
// writes and expires the same 16 hashes.
//
//	go test ./backend/redis -run '^$' -bench Script -count 3
func BenchmarkScript(b *testing.B) {
	srv := redistest.Require(b)
	client := dialServer(b, srv)
	limits := []bucket.Limit{{Name: "rps", Amount: 1_000_000_000, Period: 1000, Burst: 1_000_000_000_000}}
	groups := make([]scriptGroup, 16)
	for i := range groups {
		groups[i] = scriptGroup{
			buckets: []scriptBucket{{key: "bench:{e" + strconv.Itoa(i) + "}:r", cfg: bucket.Fingerprint(limits), limits: limits, ttlMs: 600_000}},
			calls:   []scriptCall{{costs: []int64{bucket.Milli}}},
		}
	}
	commandsOnly := rueidis.NewLuaScript(`
for k = 1, #KEYS do
  redis.call('HMGET', KEYS[k], 'cfg', 'b_rps_tk', 'b_rps_rf', 'b_rps_tc')
  redis.call('HSET', KEYS[k], 'b_rps_tk', '999', 'b_rps_rf', ARGV[1], 'b_rps_tc', '1')
  redis.call('PEXPIRE', KEYS[k], 600000)
end
return 'ok'`)
	for _, s := range []struct {
		name   string
		script *rueidis.Lua
	}{{"decide", rueidis.NewLuaScript(decideLua)}, {"commands", commandsOnly}} {
		b.Run(s.name, func(b *testing.B) {
			ctx := b.Context()
			now := time.Now().UnixMilli()
			keys, argv := scriptArgs(now, bucket.ExpiryMargin, groups)
			if err := s.script.Exec(ctx, client, keys, argv).Error(); err != nil {
				b.Fatal(err)
			}
			if _, err := srv.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if err := s.script.Exec(ctx, client, keys, argv).Error(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			stats, err := srv.Do(ctx, "INFO", "commandstats")
			if err != nil {
				b.Fatal(err)
			}
			_, line, _ := strings.Cut(stats, "cmdstat_evalsha:")
			_, usec, _ := strings.Cut(line, "usec_per_call=")
			usec, _, _ = strings.Cut(usec, ",")
			v, err := strconv.ParseFloat(usec, 64)
			if err != nil {
				b.Fatalf("EVALSHA's usec_per_call in %q: %v", line, err)
			}
			b.ReportMetric(v, "µs-in-redis/run")
		})
	}
}
