package rlqs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/descriptors"
)

// Rules gives the mapping config in force; a hot reload swaps it.
type Rules interface {
	Current() *descriptors.Config
}

// Options configure a Service. The zero Options is usable.
type Options struct {
	// Policy sizes and times the assignments.
	Policy Policy
	// MaxBuckets bounds the buckets one stream may report (10,000): the
	// reports of buckets beyond it are refused, and counted.
	MaxBuckets int
	// MaxKeys, MaxKeyLen and MaxValueLen bound a BucketId: its keys (32),
	// the bytes of a key (256) and of a value (4,096), as for a
	// descriptor. An id over them is refused, and counted.
	MaxKeys, MaxKeyLen, MaxValueLen int
	// StallTimeout ends a stream that has not taken a response off the
	// wire for this long (30 s): a client that never reads would
	// otherwise hold its buckets' tokens and its memory forever.
	StallTimeout time.Duration
	// Workers bounds the renewals one stream makes at once (16).
	Workers int
	// MaxStreams bounds the streams open at once (1,000): one more is
	// refused with RESOURCE_EXHAUSTED, and its Envoy retries.
	MaxStreams int
	// Logger hears refusals and backend failures, at most one line per
	// kind every 5 s. Nil discards them.
	Logger *slog.Logger
	// Now returns the time in epoch milliseconds; nil is the wall clock.
	Now func() int64
	// Tick is the longest a stream waits before it looks for buckets to
	// abandon and assignments to renew (1 s); it wakes for each renewal
	// at its own time.
	Tick time.Duration
}

func (o Options) withDefaults() Options {
	o.Policy = o.Policy.withDefaults()
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxBuckets, 10_000)
	def(&o.MaxKeys, 32)
	def(&o.MaxKeyLen, 256)
	def(&o.MaxValueLen, 4096)
	def(&o.Workers, 16)
	def(&o.MaxStreams, 1000)
	if o.StallTimeout <= 0 {
		o.StallTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixMilli() }
	}
	if o.Tick <= 0 {
		o.Tick = time.Second
	}
	return o
}

// Service implements Envoy's RateLimitQuotaService (DESIGN section 15)
// over a backend: each stream is one Envoy, each bucket it reports gets
// a token bucket assignment whose every token was taken from the shared
// bucket before it was sent. Safe for concurrent use; create it with
// New.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	rules Rules
	be    backend.Backend
	opts  Options
	stats counters
	logs  logLimiter
	// draining is closed by Drain: every stream ends.
	draining  chan struct{}
	drainOnce sync.Once
	// pressure is when (ms) a take on each shared bucket, on any of this
	// replica's streams, last fell short; bounded, least recent first
	// out.
	pressure *lru.Cache[string, int64]
	// newcomers counts, for each shared bucket, the slots that began on
	// this replica's streams since the first of them within a reporting
	// interval (arrive); bounded like pressure. arrivalsMu makes a count's
	// read and write one step.
	arrivalsMu sync.Mutex
	newcomers  *lru.Cache[string, arrivals]
	// spares holds what each shared bucket's slots gave up for the
	// bucket's other slots on this replica; bounded like pressure.
	spares *spares
	// ahead books the next renewal of each shared bucket's slots, which
	// a take of another of them pays for when it is due soon.
	ahead *ahead
	// draws is what this replica's decisions on each shared bucket tell
	// of its draws and the other replicas'; bounded like pressure.
	// drawsMu makes a count's read and write one step.
	drawsMu sync.Mutex
	draws   *lru.Cache[string, draws]
}

// arrivals is how many slots of a shared bucket began since since (ms).
type arrivals struct {
	since int64
	n     int
}

// arrivalWindow is how long (ms) after the first of them slots that
// begin count together: Envoy's reporting interval, within which none
// of them has reported a rate yet.
const arrivalWindow = 5000

// arrive counts a slot of the shared bucket key that began at now.
func (s *Service) arrive(key string, now int64) {
	s.arrivalsMu.Lock()
	defer s.arrivalsMu.Unlock()
	a, ok := s.newcomers.Peek(key)
	if !ok || now-a.since >= arrivalWindow {
		a = arrivals{since: now}
	}
	a.n++
	s.newcomers.Add(key, a)
}

// arrived is how many slots of key began together with the latest of
// them, while that one may not have reported a rate yet: at least one.
func (s *Service) arrived(key string, now int64) int {
	s.arrivalsMu.Lock()
	defer s.arrivalsMu.Unlock()
	a, ok := s.newcomers.Peek(key)
	if !ok || now-a.since >= 2*arrivalWindow {
		return 1
	}
	return a.n
}

// peers is what this replica's streams know together of the shared
// bucket key at now.
func (s *Service) peers(key string, now int64) peers {
	s.drawsMu.Lock()
	d, _ := s.draws.Peek(key)
	s.drawsMu.Unlock()
	return peers{contended: s.contended(key, now), newcomers: s.arrived(key, now), spare: spare{of: s.spares, key: key},
		draws: d, saw: func(level, took uint64, c capacity) { s.saw(key, level, took, now, c) }}
}

// peersOf is peers for a renewal of the slot sl: with ahead, which
// claims the renewals of the bucket's other slots due soon.
func (s *Service) peersOf(key string, sl *slot, now int64) peers {
	p := s.peers(key, now)
	p.ahead = func() uint64 { return s.ahead.claim(key, sl, now) }
	return p
}

// saw counts a decision on the shared bucket key made at now.
func (s *Service) saw(key string, level, took uint64, now int64, c capacity) {
	s.drawsMu.Lock()
	defer s.drawsMu.Unlock()
	d, _ := s.draws.Peek(key)
	s.draws.Add(key, d.saw(level, took, now, c))
}

// sharedKey names the shared bucket req takes from, for pressure and
// newcomers.
func sharedKey(req backend.Request) string { return req.Entity + "\x00" + req.Resource }

// contendedFor is how long after a take fell short a bucket counts as
// contended for every stream of the replica.
const contendedFor = 3000 // ms

// contended reports whether a take on the bucket key fell short lately.
func (s *Service) contended(key string, now int64) bool {
	at, ok := s.pressure.Peek(key)
	return ok && now-at < contendedFor
}

// New returns a Service assigning the buckets of rules' domains from
// be's shared buckets.
func New(rules Rules, be backend.Backend, opts Options) *Service {
	opts = opts.withDefaults()
	size := max(opts.MaxBuckets, 10_000)
	pressure, _ := lru.New[string, int64](size) // a positive size never fails
	newcomers, _ := lru.New[string, arrivals](size)
	draws, _ := lru.New[string, draws](size)
	svc := &Service{rules: rules, be: be, opts: opts, pressure: pressure, newcomers: newcomers, draws: draws, draining: make(chan struct{})}
	// Spares pushed out by more buckets than the bound are lost to
	// everyone, as a stream's bank is when it ends.
	svc.spares = newSpares(size, func(n uint64) { svc.stats.stranded.Add(n) })
	svc.ahead = newAhead(size)
	return svc
}

// Drain ends every stream, now and from now on, with UNAVAILABLE, so
// that Envoys reconnect to another replica at once: a server shutting
// down gracefully would otherwise wait for streams that never end on
// their own. What the streams held is counted stranded.
func (s *Service) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Register serves svc on s.
func Register(s grpc.ServiceRegistrar, svc *Service) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(s, svc)
}

// Stats are a Service's running totals, and its streams and buckets now.
type Stats struct {
	Streams int64 `json:"streams"`
	Buckets int64 `json:"buckets"`
	// Assignments counts the assignments sent, by kind; Abandoned the
	// abandon actions.
	TokenBuckets uint64 `json:"assignments_token_bucket"`
	DenyAll      uint64 `json:"assignments_deny_all"`
	AllowAll     uint64 `json:"assignments_allow_all"`
	Abandoned    uint64 `json:"abandoned"`
	// Leased is every token taken from shared buckets for assignments;
	// Stranded those taken for streams that ended (or buckets abandoned)
	// before their Envoy could have admitted them: an under-admission,
	// counted high (an Envoy's admissions after its last report count as
	// stranded).
	Leased   uint64 `json:"tokens_leased"`
	Stranded uint64 `json:"tokens_stranded"`
	// Returned counts tokens an Envoy left unused while the bucket was
	// contended, given up to the replica's spares for the bucket, from
	// which the next takes of its other Envoys are paid.
	Returned uint64 `json:"tokens_returned"`
	// Refused counts usage reports refused (a bad BucketId, an absurd
	// count, a bucket over MaxBuckets); BackendErrors renewals that failed.
	Refused       uint64 `json:"reports_refused"`
	BackendErrors uint64 `json:"backend_errors"`
}

type counters struct {
	streams, buckets                         atomic.Int64
	tokenBuckets, denyAll, allowAll, abandon atomic.Uint64
	leased, stranded, returned               atomic.Uint64
	refused, backendErrors                   atomic.Uint64
}

// Stats returns the running totals.
func (s *Service) Stats() Stats {
	c := &s.stats
	return Stats{Streams: c.streams.Load(), Buckets: c.buckets.Load(),
		TokenBuckets: c.tokenBuckets.Load(), DenyAll: c.denyAll.Load(), AllowAll: c.allowAll.Load(),
		Abandoned: c.abandon.Load(), Leased: c.leased.Load(), Stranded: c.stranded.Load(), Returned: c.returned.Load(),
		Refused: c.refused.Load(), BackendErrors: c.backendErrors.Load()}
}

// StreamRateLimitQuotas serves one Envoy's stream until it ends: reports
// come in, and assignments go out when a bucket is first reported, when
// its demand outgrows its assignment, and before each assignment
// expires.
func (s *Service) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	if n := s.stats.streams.Add(1); n > int64(s.opts.MaxStreams) {
		s.stats.streams.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "this replica serves %d quota streams already", s.opts.MaxStreams)
	}
	defer s.stats.streams.Add(-1)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()

	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	out := newSender(stream)
	defer out.close()

	st := &streamState{svc: s, slots: map[string]*slot{}}
	defer st.end()
	wake := time.NewTimer(s.opts.Tick)
	defer wake.Stop()
	for {
		select {
		case m := <-reports:
			if err := st.report(m); err != nil {
				return err
			}
		case <-wake.C:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case err := <-out.failed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-s.draining:
			return status.Error(codes.Unavailable, "this replica is shutting down")
		}
		if out.stalled(s.opts.StallTimeout) {
			s.logf(ctx, "stall", "ending a quota stream whose client has not read its responses", slog.String("domain", st.domain))
			return status.Errorf(codes.ResourceExhausted, "the stream has not read its responses for %v", s.opts.StallTimeout)
		}
		if out.busy() {
			// No tokens are taken for responses that cannot leave.
			wake.Reset(s.opts.Tick)
			continue
		}
		if resp := st.due(ctx); len(resp.GetBucketAction()) > 0 {
			out.send(resp)
		}
		// The next renewal at its own time, not on a tick every stream
		// shares: over the limit, the stream that renews first after the
		// shared bucket's refill takes it, and a common tick would make
		// that the same stream every time.
		wake.Reset(min(max(time.Duration(st.next()-s.opts.Now())*time.Millisecond, 5*time.Millisecond), s.opts.Tick))
	}
}

// logf logs msg at most once every 5 s per kind.
func (s *Service) logf(ctx context.Context, kind, msg string, attrs ...slog.Attr) {
	if ok, left := s.logs.allow(kind, time.Now()); ok {
		s.opts.Logger.LogAttrs(ctx, slog.LevelWarn, msg, append(attrs, slog.Int("not_logged_since_last", left))...)
	}
}

// logLimiter lets one line per kind through every 5 s.
type logLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
	left map[string]int
}

func (l *logLimiter) allow(kind string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.left = map[string]time.Time{}, map[string]int{}
	}
	if now.Sub(l.last[kind]) < 5*time.Second {
		l.left[kind]++
		return false, 0
	}
	n := l.left[kind]
	l.last[kind], l.left[kind] = now, 0
	return true, n
}

// sender sends a stream's responses from a goroutine of its own, one at
// a time, so that a client slow to read holds up no report.
type sender struct {
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer
	out    chan *rlqsv3.RateLimitQuotaResponse
	failed chan error
	since  atomic.Int64 // UnixNano when the send under way began; 0: none
	done   chan struct{}
}

func newSender(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) *sender {
	s := &sender{stream: stream, out: make(chan *rlqsv3.RateLimitQuotaResponse, 1),
		failed: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for r := range s.out {
			err := stream.Send(r)
			s.since.Store(0)
			if err != nil {
				s.failed <- err
				return
			}
		}
	}()
	return s
}

// busy reports whether a response is still waiting to leave.
func (s *sender) busy() bool { return s.since.Load() != 0 }

// stalled reports whether one response has been leaving for over d.
func (s *sender) stalled(d time.Duration) bool {
	t := s.since.Load()
	return t != 0 && time.Since(time.Unix(0, t)) > d
}

func (s *sender) send(r *rlqsv3.RateLimitQuotaResponse) {
	s.since.Store(time.Now().UnixNano())
	s.out <- r
}

// close stops the sender; a send blocked on a client that does not read
// ends with the stream's context, once the handler has returned.
func (s *sender) close() { close(s.out) }
