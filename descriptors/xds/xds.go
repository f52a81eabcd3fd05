// Package xds keeps Sluice's rules from an xDS management server, as
// Envoy Gateway delivers them to its rate-limit service: a
// state-of-the-world subscription over the aggregated discovery stream
// (ADS) to resources of type ratelimit.config.ratelimit.v3.RateLimitConfig,
// one per domain.
//
// Each response is the whole rule set. It is read as rule files are read
// (descriptors.FromRateLimitConfigs) and replaces the rules in force at
// once, as a file reload does; then it is ACKed. A response that does not
// read is NACKed with the error, and the rules in force stay. While the
// server is away, unreachable, hung or talking nonsense, the last good
// rules keep serving, and the subscription reconnects with backoff.
//
// A Source starts with no rules (a config that limits nothing) until the
// first good response; Ready tells when that arrives.
package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/descriptors"
)

// TypeURL is the type of the resources a Source subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Options configure a Source. NodeID is required; zero values of the rest
// take the defaults named on each field.
type Options struct {
	// NodeID (and NodeCluster, optional) identify this replica to the
	// server, which picks the snapshot by them (Envoy Gateway serves
	// every rate-limit replica one node ID).
	NodeID, NodeCluster string
	// Log receives a line per snapshot taken or refused and per lost
	// stream; nil discards them.
	Log *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before reconnecting after
	// a stream ends (500 ms and 30 s): it doubles from the first to the
	// second while the server stays away, with jitter, and starts over
	// once a stream has delivered a response.
	MinBackoff, MaxBackoff time.Duration
}

// Source is the rule set an xDS server last sent that read well. It is
// safe for concurrent use; it lives until the context given to Subscribe
// ends.
type Source struct {
	opts  Options
	conn  grpc.ClientConnInterface
	log   *slog.Logger
	cur   atomic.Pointer[descriptors.Config]
	ready chan struct{}
	once  sync.Once
	done  chan struct{}

	mu      sync.Mutex
	stats   descriptors.ReloadStats
	version string // of the rules in force: what a NACK reports as applied
	refused string // the version last refused
}

// Subscribe starts subscribing over conn and returns at once.
func Subscribe(ctx context.Context, conn grpc.ClientConnInterface, opts Options) (*Source, error) {
	if opts.NodeID == "" {
		return nil, errors.New("xds: no node ID")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(30*time.Second, opts.MinBackoff)
	}
	empty, err := descriptors.Parse(nil)
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	s := &Source{opts: opts, conn: conn, log: opts.Log.With("xds_node", opts.NodeID), ready: make(chan struct{}), done: make(chan struct{})}
	s.cur.Store(empty)
	go s.run(ctx)
	return s, nil
}

// Current returns the rules in force.
func (s *Source) Current() *descriptors.Config { return s.cur.Load() }

// Ready is closed once the first good response has been taken.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// Done is closed once the subscription has stopped (its context ended).
func (s *Source) Done() <-chan struct{} { return s.done }

// Stats counts the responses taken (OK) and refused (Failed).
func (s *Source) Stats() descriptors.ReloadStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Source) run(ctx context.Context) {
	defer close(s.done)
	backoff := s.opts.MinBackoff
	for ctx.Err() == nil {
		delivered, err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if delivered {
			backoff = s.opts.MinBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		s.log.Warn("xds stream ended; serving the last good rules and reconnecting",
			slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, s.opts.MaxBackoff)
	}
}

// stream runs one ADS stream until it fails; delivered reports whether
// any response came on it.
func (s *Source) stream(ctx context.Context) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(s.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	node := &corev3.Node{Id: s.opts.NodeID, Cluster: s.opts.NodeCluster}
	s.mu.Lock()
	version := s.version
	s.mu.Unlock()
	// The first request names the version in force, so a server that
	// still has it need not send it again.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: version}); err != nil {
		return false, fmt.Errorf("send: %w", err)
	}
	// A server answers a NACK, which names the version in force, by
	// sending the version it has again: go-control-plane's snapshot
	// cache does, for as long as the bad snapshot is its latest. Each
	// repeat of a refused version is NACKed after a wait that doubles
	// (MinBackoff to MaxBackoff), not at once, so that the two do not
	// spin; it is logged and counted once.
	repeatWait := s.opts.MinBackoff
	for {
		resp, err := st.Recv()
		if err != nil {
			return delivered, fmt.Errorf("receive: %w", err)
		}
		delivered = true
		req := &discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		var cfg *descriptors.Config
		if resp.GetTypeUrl() != TypeURL {
			// Not what was asked for: refuse it, keep the rules.
			err = fmt.Errorf("type %q, want %q", resp.GetTypeUrl(), TypeURL)
			req.TypeUrl = resp.GetTypeUrl()
		} else {
			cfg, err = decode(resp)
		}
		if err != nil {
			var repeat bool
			req.VersionInfo, req.ErrorDetail, repeat = s.refuseOnce(resp, err)
			if repeat {
				if err := sleep(ctx, repeatWait); err != nil {
					return delivered, err
				}
				repeatWait = min(repeatWait*2, s.opts.MaxBackoff)
			}
		} else {
			req.VersionInfo = s.take(resp, cfg)
			repeatWait = s.opts.MinBackoff
		}
		if err := st.Send(req); err != nil {
			return delivered, fmt.Errorf("send: %w", err)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// refuseOnce is refuse for a version not refused just before; for a
// repeat of it, it only returns the NACK's content, and repeat.
func (s *Source) refuseOnce(resp *discoveryv3.DiscoveryResponse, err error) (version string, detail *statuspb.Status, repeat bool) {
	s.mu.Lock()
	repeat = resp.GetVersionInfo() != "" && resp.GetVersionInfo() == s.refused
	s.refused = resp.GetVersionInfo()
	version = s.version
	s.mu.Unlock()
	if repeat {
		return version, &statuspb.Status{Code: 3, Message: err.Error()}, true
	}
	version, detail = s.refuse(resp, err)
	return version, detail, false
}

// decode reads a response's resources as one rule set.
func decode(resp *discoveryv3.DiscoveryResponse) (*descriptors.Config, error) {
	cfgs := make([]*rlconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		c := &rlconfv3.RateLimitConfig{}
		if err := a.UnmarshalTo(c); err != nil {
			return nil, fmt.Errorf("resource %d (%s): %w", i, a.GetTypeUrl(), err)
		}
		cfgs = append(cfgs, c)
	}
	return descriptors.FromRateLimitConfigs(cfgs)
}

// take puts cfg in force and returns the version to ACK.
func (s *Source) take(resp *discoveryv3.DiscoveryResponse, cfg *descriptors.Config) string {
	s.cur.Store(cfg)
	now := time.Now()
	s.mu.Lock()
	s.version, s.refused = resp.GetVersionInfo(), ""
	s.stats.OK++
	s.stats.LastOK, s.stats.LastAttempt, s.stats.LastError = now, now, ""
	s.mu.Unlock()
	s.once.Do(func() { close(s.ready) })
	s.log.Info("xds rules taken", slog.String("version", resp.GetVersionInfo()),
		slog.Any("domains", cfg.Domains()), slog.String("fingerprint", cfg.Fingerprint()[:12]))
	return resp.GetVersionInfo()
}

// refuse counts and logs a response that did not read, and returns what a
// NACK carries: the version still in force and the error.
func (s *Source) refuse(resp *discoveryv3.DiscoveryResponse, err error) (string, *statuspb.Status) {
	s.mu.Lock()
	s.stats.Failed++
	s.stats.LastAttempt, s.stats.LastError = time.Now(), err.Error()
	version := s.version
	s.mu.Unlock()
	s.log.Error("xds rules refused, keeping the rules in force", slog.String("version", resp.GetVersionInfo()),
		slog.String("in_force", version), slog.String("error", err.Error()))
	// 3 is INVALID_ARGUMENT: the server sent rules that do not read.
	return version, &statuspb.Status{Code: 3, Message: err.Error()}
}
