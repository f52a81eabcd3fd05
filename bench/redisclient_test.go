package bench

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// casScript is the shape of a Redis backend's decision: one script per
// decision that checks the bucket's version, writes the new state and its
// TTL, or returns what is there.
const casScript = `
local v = redis.call('HGET', KEYS[1], 'v')
if (v == false and ARGV[1] == '') or v == ARGV[1] then
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'tk', ARGV[3], 'rf', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 1
end
return redis.call('HGETALL', KEYS[1])
`

// BenchmarkRedisClient measures the two well-kept Go clients, go-redis
// and rueidis, running that script against one real redis-server on
// loopback, side by side in one run: serial (one call at a time: the
// latency a decision adds) and parallel (benchConcurrency goroutines, as
// a loaded Sluice runs). Each goroutine has its own key, so every call
// takes the write path. allocs/op are the client's, per call.
func BenchmarkRedisClient(b *testing.B) {
	srv := redistest.Require(b)
	type caller func(ctx context.Context, key string, args ...string) error
	clients := []struct {
		name string
		open func(b *testing.B) caller
	}{
		{"go-redis", func(b *testing.B) caller {
			c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), PoolSize: benchConcurrency})
			b.Cleanup(func() { c.Close() })
			s := goredis.NewScript(casScript)
			return func(ctx context.Context, key string, args ...string) error {
				argv := make([]any, len(args))
				for i, a := range args {
					argv[i] = a
				}
				return s.Run(ctx, c, []string{key}, argv...).Err()
			}
		}},
		{"rueidis", func(b *testing.B) caller {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			s := rueidis.NewLuaScript(casScript)
			return func(ctx context.Context, key string, args ...string) error {
				return s.Exec(ctx, c, []string{key}, args).Error()
			}
		}},
	}
	for _, cl := range clients {
		for _, mode := range []string{"serial", "parallel"} {
			b.Run(cl.name+"/"+mode, func(b *testing.B) {
				call := cl.open(b)
				ctx := context.Background()
				var next atomic.Int64
				run := func(loop func() bool) {
					key := fmt.Sprintf("bench:%s:%s:%d", cl.name, mode, next.Add(1))
					v := 0
					for loop() {
						want := ""
						if v > 0 {
							want = strconv.Itoa(v)
						}
						v++
						if err := call(ctx, key, want, strconv.Itoa(v), "100000", "1700000000000", "60000"); err != nil {
							b.Error(err)
							return
						}
					}
				}
				b.ReportAllocs()
				if mode == "serial" {
					run(b.Loop)
					return
				}
				b.SetParallelism(max(1, benchConcurrency/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) { run(pb.Next) })
			})
		}
	}
}
