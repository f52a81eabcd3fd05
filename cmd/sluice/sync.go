package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/internal/callgate"
	"github.com/sluice-rl/sluice/regions"
	"github.com/sluice-rl/sluice/regions/syncer"
	"github.com/sluice-rl/sluice/telemetry"
)

// regionsOptions are what sync and shares need: the region's own store,
// as its replicas are given it, the global flags, and every other
// region's store.
type regionsOptions struct {
	store  adminOptions
	global globalOptions
	stores []string // NAME=URL
}

func (o *regionsOptions) addFlags(f *pflag.FlagSet) {
	addStoreFlags(f, &o.store)
	o.global.addFlags(f)
	f.StringArrayVar(&o.stores, "global-store", nil, "another region's store, as NAME=URL, once for each region of --global-regions but this one: dynamodb://TABLE?region=AWS_REGION[&endpoint=URL] or a Redis URL (redis://, rediss://, unix://); read only, with --key-prefix")
}

// open connects to every region's store and builds this region's sync;
// release closes what it connected.
func (o *regionsOptions) open(ctx context.Context) (s *syncer.Sync, release func(), err error) {
	if o.global.region == "" || o.global.regions == "" {
		return nil, nil, usageError{errors.New("--global-region and --global-regions are required: this region, and every region's weight, as its replicas are given them")}
	}
	split, err := parseSplit(o.global.regions)
	if err != nil {
		return nil, nil, err
	}
	me := regions.Region(o.global.region)
	if !split.Has(me) {
		return nil, nil, usageError{fmt.Errorf("--global-region %q is not one of --global-regions %v", me, split.Regions())}
	}
	clock, err := o.global.clock()
	if err != nil {
		return nil, nil, err
	}
	if clock.Window == 0 {
		return nil, nil, usageError{errors.New("--global-window 0 fixes every region at its base: there are no shares to move")}
	}
	far := map[regions.Region]string{}
	for _, s := range o.stores {
		name, raw, ok := strings.Cut(s, "=")
		r := regions.Region(name)
		switch {
		case !ok || name == "" || raw == "":
			return nil, nil, usageError{fmt.Errorf("--global-store %q: want NAME=URL", s)}
		case r == me:
			return nil, nil, usageError{fmt.Errorf("--global-store %q: that is this region, whose store the --backend flags give", s)}
		case !split.Has(r):
			return nil, nil, usageError{fmt.Errorf("--global-store %q: %q is not one of --global-regions %v", s, name, split.Regions())}
		case far[r] != "":
			return nil, nil, usageError{fmt.Errorf("--global-store: region %q is named twice", name)}
		}
		far[r] = raw
	}
	for _, r := range split.Regions() {
		if r != me && far[r] == "" {
			return nil, nil, usageError{fmt.Errorf("no --global-store for region %q: a sync reads every region's usage and records", r)}
		}
	}
	if o.store.output == "" {
		o.store.output = "table" // a sync prints nothing
	}
	var closers []func()
	release = func() {
		for _, c := range closers {
			c()
		}
		o.store.close()
	}
	own, err := o.store.admin(ctx)
	if err != nil {
		release()
		return nil, nil, err
	}
	stores := map[regions.Region]syncer.Store{me: own.(syncer.Store)}
	for r, raw := range far {
		st, c, err := openStore(ctx, raw, o.store.keyPrefix)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("--global-store %s: %w", r, err)
		}
		closers = append(closers, c)
		stores[r] = st
	}
	return &syncer.Sync{Me: me, Split: split, Clock: clock, Stores: stores, Budget: syncer.DefaultBudget(clock),
		Now: func() int64 { return time.Now().UnixMilli() }}, release, nil
}

// openStore connects to another region's store, named by URL.
func openStore(ctx context.Context, raw, keyPrefix string) (syncer.Store, func(), error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, usageError{err}
	}
	switch u.Scheme {
	case "dynamodb":
		q := u.Query()
		if u.Host == "" {
			return nil, nil, usageError{fmt.Errorf("%q: want dynamodb://TABLE?region=AWS_REGION", raw)}
		}
		client, err := newDynamoDBClient(ctx, q.Get("region"), q.Get("endpoint"), nil)
		if err != nil {
			return nil, nil, err
		}
		// The sync's usage reads queue for the table rather than land on
		// it all at once, ahead of the replicas' decisions (callgate).
		a, err := sluiceddb.NewAdmin(callgate.DynamoDB(client, callgate.New(callgate.SyncQueries)), u.Host, keyPrefix, nil)
		if err != nil {
			return nil, nil, usageError{err}
		}
		return a, func() {}, nil
	case "redis", "rediss", "unix":
		dialCtx, cancel := context.WithTimeout(ctx, redisDialTimeout)
		defer cancel()
		client, err := dialRedis(dialCtx, redis.Conn{URL: raw})
		if err != nil {
			return nil, nil, err
		}
		a, err := redis.NewAdmin(client, keyPrefix, nil)
		if err != nil {
			client.Close()
			return nil, nil, usageError{err}
		}
		return a, client.Close, nil
	}
	return nil, nil, usageError{fmt.Errorf("%q: want dynamodb://TABLE?region=AWS_REGION or a redis:// URL", raw)}
}

type syncOptions struct {
	regionsOptions
	httpAddr            string
	metricsKeys         int
	logLevel, logFormat string
}

func newSyncCommand() *cobra.Command {
	var o syncOptions
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Move the shares of global rules between regions, for one region",
		Long: `Run one region's sync of the rules marked global: every window it reads
what each region's replicas were asked for each global key in the window
before, and every region's share records, and writes its own region's
records so that shares follow demand, never summing to more than the limit.
Run one in each region (two are safe, never needed), beside the region's
replicas, with the same --global-* flags they have. It writes only to its
own region's store and reads the others'. docs/regions.md explains it all.`,
		Example: `  sluice sync --table sluice --region us-east-1 \
    --global-region us-east-1 --global-regions us-east-1=2,eu-west-1=1 \
    --global-store 'eu-west-1=dynamodb://sluice?region=eu-west-1'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd.ErrOrStderr(), o.logLevel, o.logFormat)
			if err != nil {
				return err
			}
			return runSync(cmd.Context(), o, log)
		},
	}
	f := cmd.Flags()
	o.addFlags(f)
	f.StringVar(&o.httpAddr, "http-addr", ":8081", "address of /healthz and /metrics")
	f.IntVar(&o.metricsKeys, "metrics-keys", 20, "the busiest global keys of each window whose shares and demand /metrics shows, labelled with their entity; 0: none")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
	return cmd
}

// runSync runs a region's sync until ctx ends.
func runSync(ctx context.Context, o syncOptions, log *slog.Logger) error {
	if o.metricsKeys < 0 {
		return usageError{fmt.Errorf("--metrics-keys %d: want 0 or more", o.metricsKeys)}
	}
	s, release, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer release()
	tel, err := telemetry.New(ctx, telemetry.Options{})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	st := &syncStats{top: o.metricsKeys}
	if err := tel.ObserveSync(st.snapshot); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.MetricsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Healthy while rounds run: one every window.
		if last := st.lastRound(); !last.IsZero() && time.Since(last) > 3*time.Duration(s.Clock.Window)*time.Millisecond {
			http.Error(w, fmt.Sprintf("no round since %s", last.Format(time.RFC3339)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	log.Info("sync running", slog.String("region", string(s.Me)), slog.String("http", ln.Addr().String()),
		slog.Duration("window", time.Duration(s.Clock.Window)*time.Millisecond))
	s.Run(ctx, func(r syncer.Round) {
		st.add(r, s.Split)
		level := slog.LevelDebug
		if len(r.Unread)+len(r.Refused)+len(r.Failed) > 0 {
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "sync round", slog.Int64("slot", int64(r.Slot)), slog.Int("keys", len(r.Keys)), slog.Int("wrote", r.Wrote),
			slog.Any("unread", firstErrors(r.Unread)), slog.Any("refused", firstErrors(r.Refused)), slog.Any("failed", firstErrors(r.Failed)))
	})
	return nil
}

// firstErrors are the first few of errs, as strings, for a log line.
func firstErrors(errs []error) []string {
	out := make([]string, 0, min(len(errs), 5))
	for _, err := range errs[:min(len(errs), 5)] {
		out = append(out, err.Error())
	}
	if len(errs) > 5 {
		out = append(out, fmt.Sprintf("and %d more", len(errs)-5))
	}
	return out
}

// syncStats are a sync's totals, for its metrics.
type syncStats struct {
	top  int
	mu   sync.Mutex
	s    telemetry.SyncStats
	last time.Time
}

func (st *syncStats) add(r syncer.Round, split regions.Split) {
	rows := slices.Clone(r.Keys)
	total := func(k syncer.KeyRound) (n int64) {
		for _, d := range k.Demand {
			n += d
		}
		return n
	}
	slices.SortStableFunc(rows, func(a, b syncer.KeyRound) int { return cmp.Compare(total(b), total(a)) })
	top := make([]telemetry.KeyShares, 0, min(len(rows), st.top))
	for _, k := range rows[:min(len(rows), st.top)] {
		ks := telemetry.KeyShares{Entity: k.Key.Entity, Resource: k.Key.Resource, Share: map[string]float64{}, Demand: map[string]float64{}}
		for _, region := range split.Regions() {
			if v, ok := k.Shares[region]; ok {
				ks.Share[string(region)] = float64(v) / regions.Total
			}
			if v, ok := k.Demand[region]; ok {
				ks.Demand[string(region)] = float64(v) / regions.Total
			}
		}
		top = append(top, ks)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.s.Rounds++
	st.s.Writes += uint64(r.Wrote)
	st.s.Unread += uint64(len(r.Unread))
	st.s.Refused += uint64(len(r.Refused))
	st.s.Failed += uint64(len(r.Failed))
	st.s.Keys = len(r.Keys)
	st.s.Seconds = r.Took.Seconds()
	st.s.Top = top
	st.last = time.Now()
}

func (st *syncStats) snapshot() telemetry.SyncStats {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.s
}

func (st *syncStats) lastRound() time.Time {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last
}
