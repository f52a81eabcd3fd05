package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/internal/faultproxy"
)

// redisOutageEnv is Sluice on a redis-server of its own, behind a fault
// proxy, under the load and checks of the DynamoDB outage tests.
type redisOutageEnv struct {
	redis *redistest.Server
	proxy *faultproxy.Proxy
	dir   string
}

func newRedisOutageEnv(t *testing.T) *redisOutageEnv {
	t.Helper()
	srv := redistest.Require(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e := &redisOutageEnv{redis: srv, proxy: p, dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(e.dir, "edge.yaml"), []byte(rulesHigh), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *redisOutageEnv) serve(t *testing.T, policy string) *server {
	t.Helper()
	o := testOptions(e.dir)
	o.backend, o.redis.URL, o.onBackendError = "redis", "redis://"+e.proxy.Addr(), policy
	// Leases off: with them a replica keeps deciding from what it leased
	// while Redis is away, and these tests check the failure policy's
	// answers.
	o.leaseHorizon = 0
	s, _, _ := startTestServer(t, o)
	return s
}

// do runs a command on the server directly (not through the proxy).
func (e *redisOutageEnv) do(t *testing.T, args ...string) {
	t.Helper()
	if _, err := e.redis.Do(context.Background(), args...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// fault is one way Redis fails: break starts it, mend ends it and
// returns when Redis is back.
type redisFault struct {
	name, policy string
	breakIt      func(t *testing.T, e *redisOutageEnv)
	mend         func(t *testing.T, e *redisOutageEnv) time.Time
}

// Redis killed (its data gone) and restarted, frozen, slow, cut off by a
// partition, and full (maxmemory with noeviction, which refuses every
// write): while it fails, every call gets the failure policy's answer
// within its deadline; decisions resume within 2 s of its return; the
// metrics count what callers saw; nothing leaks.
func TestRedisOutages(t *testing.T) {
	e := newRedisOutageEnv(t)
	restart := func(t *testing.T, e *redisOutageEnv) time.Time {
		if err := e.redis.Restart(t.Context()); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	faults := []redisFault{
		{"killed", "error", func(t *testing.T, e *redisOutageEnv) { e.redis.Kill() }, restart},
		{"killed", "allow", func(t *testing.T, e *redisOutageEnv) { e.redis.Kill() }, restart},
		{"killed", "deny", func(t *testing.T, e *redisOutageEnv) { e.redis.Kill() }, restart},
		{"frozen", "allow", func(t *testing.T, e *redisOutageEnv) {
			if err := e.redis.Pause(); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, e *redisOutageEnv) time.Time {
			if err := e.redis.Resume(); err != nil {
				t.Fatal(err)
			}
			return time.Now()
		}},
		// 600 ms each way: every call's 400 ms for the backend is spent
		// before Redis has its command.
		{"slow", "deny", func(t *testing.T, e *redisOutageEnv) { e.proxy.SetDelay(600 * time.Millisecond) },
			func(t *testing.T, e *redisOutageEnv) time.Time { e.proxy.SetDelay(0); return time.Now() }},
		{"partitioned", "error", func(t *testing.T, e *redisOutageEnv) { e.proxy.Partition() },
			func(t *testing.T, e *redisOutageEnv) time.Time { e.proxy.Heal(); return time.Now() }},
		{"full", "deny", func(t *testing.T, e *redisOutageEnv) {
			e.do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			e.do(t, "CONFIG", "SET", "maxmemory", "1")
		}, func(t *testing.T, e *redisOutageEnv) time.Time {
			e.do(t, "CONFIG", "SET", "maxmemory", "0")
			return time.Now()
		}},
	}
	for _, f := range faults {
		t.Run(f.name+"/"+f.policy, func(t *testing.T) {
			s := e.serve(t, f.policy)
			l := startLoad(t, s.grpcLn.Addr().String(), outageWorkers)
			broken := time.Now()
			f.breakIt(t, e)
			time.Sleep(1500 * time.Millisecond)
			mending := time.Now()
			back := f.mend(t, e)
			time.Sleep(3500 * time.Millisecond)
			answers := l.end()

			checkAnswered(t, answers)
			baseline(t, between(answers, l.steady, broken))
			// A call in flight when Redis broke, or when it was mended,
			// may go either way: a frozen or slow Redis that comes back
			// answers what it was sent.
			checkPolicy(t, "redis "+f.name, f.policy, between(answers, broken.Add(outageDeadline), mending.Add(-outageDeadline)))
			checkRecovered(t, "redis "+f.name, answers, back)
			checkCounted(t, s, f.policy, answers)
			checkNoLeaks(t, l.goroutines, l.heap)
			t.Logf("%d calls", len(answers))
		})
	}
}
