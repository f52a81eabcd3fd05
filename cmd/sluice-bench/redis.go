package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/bench"
	"github.com/sluice-rl/sluice/internal/faultproxy"
)

// redisPrefix is the key prefix of compare mode's Redis side, so that
// its buckets stay apart from a deployment's (sluice) on a shared Redis.
const redisPrefix = "sluice-bench"

// redisHostPort is the host:port of a redis:// URL on loopback: the only
// kind compare mode drives, and the kind a proxy can stand in front of.
func redisHostPort(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("not a URL") // url.Error would repeat a password
	}
	if u.Scheme != "redis" || u.Port() == "" || u.Opaque != "" {
		return "", fmt.Errorf("%s: want redis://host:port", u.Redacted())
	}
	if h := u.Hostname(); !(strings.EqualFold(h, "localhost") || net.ParseIP(h).IsLoopback()) {
		return "", fmt.Errorf("%s: only loopback hosts (127.0.0.0/8, ::1, localhost) are allowed", u.Redacted())
	}
	return u.Host, nil
}

// redisSide is compare mode's Sluice on the Redis backend, served on
// loopback with its /metrics.
type redisSide struct {
	svc     *bench.RedisService
	addr    string
	metrics string
	// where describes the Redis it runs on.
	where   string
	cleanup []func()
}

// close stops what start started, last first.
func (r *redisSide) close() {
	for i := len(r.cleanup) - 1; i >= 0; i-- {
		r.cleanup[i]()
	}
}

// startRedis starts compare mode's Redis side: a redis-server (-redis)
// or the one at -redis-url, behind a delaying proxy with -redis-delay, a
// Sluice service on it with the rules and options of the memory side,
// its gRPC server and its /metrics, so that each run's Redis round trips
// are counted exactly as a replica's are (bench.Config.Metrics).
func (o options) startRedis(ctx context.Context) (r *redisSide, err error) {
	r = &redisSide{}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	redisURL := o.redisURL
	r.where = "Redis at " + redisURL
	if o.redis {
		dir, err := os.MkdirTemp("", "sluice-bench-redis-")
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		r.cleanup = append(r.cleanup, func() { os.RemoveAll(dir) })
		// In memory (no RDB, no AOF) as redistest runs it, and refusing
		// writes rather than evicting buckets when full, as Sluice wants
		// (docs/redis.md).
		srv, err := redistest.Start(ctx, dir, redistest.Options{Config: []string{"maxmemory-policy", "noeviction"}})
		if err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		r.cleanup = append(r.cleanup, srv.Stop)
		redisURL = "redis://" + srv.Addr()
		r.where = "redis-server at " + srv.Addr()
	}
	if o.redisDelay > 0 {
		hostPort, err := redisHostPort(redisURL)
		if err != nil {
			return nil, err
		}
		p, err := faultproxy.New(hostPort)
		if err != nil {
			return nil, err
		}
		r.cleanup = append(r.cleanup, func() { _ = p.Close() })
		p.SetDelay(o.redisDelay)
		u, _ := url.Parse(redisURL)
		u.Host = p.Addr()
		redisURL = u.String()
		r.where += fmt.Sprintf(", %v added to every round trip (proxy at %s)", o.redisDelay, p.Addr())
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client, err := redis.Dial(dialCtx, redis.Conn{URL: redisURL})
	if err != nil {
		return nil, err
	}
	r.cleanup = append(r.cleanup, client.Close)
	// The TTL rules of the memory side, and serve's defaults otherwise.
	opts := redis.Options{KeyPrefix: redisPrefix, TTLMultiplier: backend.DefaultTTLMultiplier}
	if !o.redisCoalesce {
		opts.MaxBatch = 1 // as serve --coalesce-writes=false
		r.where += ", coalescing off"
	}
	r.svc, err = bench.NewRedisService(bench.RulesYAML, client, opts)
	if err != nil {
		return nil, err
	}
	r.cleanup = append(r.cleanup, r.svc.Close)
	addr, stop, err := bench.Serve(r.svc.Service, r.svc.ServerOptions...)
	if err != nil {
		return nil, err
	}
	r.addr = addr
	r.cleanup = append(r.cleanup, func() { _ = stop() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.svc.Metrics)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	r.cleanup = append(r.cleanup, func() { _ = hs.Close() })
	r.metrics = "http://" + ln.Addr().String() + "/metrics"
	return r, nil
}

// decisions is how many decisions the service's metrics have counted
// since it started: the denominator of its Stats.
func (r *redisSide) decisions() (float64, error) {
	rec := httptest.NewRecorder()
	r.svc.Metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	s, err := bench.ParseMetrics(rec.Body)
	if err != nil {
		return 0, err
	}
	return s.Calls[bench.Call{Backend: bench.BackendRedis, Operation: bench.OpDecide}], nil
}
