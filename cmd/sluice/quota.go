package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func newQuotaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "quota",
		Short:   "Look at Sluice's quota service as Envoy's rate_limit_quota filter sees it",
		Example: `  sluice quota watch --domain quota --bucket api=search,tenant=acme`,
	}
	cmd.AddCommand(newQuotaWatchCommand())
	return cmd
}

type quotaWatchOptions struct {
	addr     string
	domain   string
	buckets  []string
	rate     float64
	interval time.Duration
	duration time.Duration
	tls      clientTLS
}

func newQuotaWatchCommand() *cobra.Command {
	var o quotaWatchOptions
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Open a quota stream as an Envoy would and print the assignments it gets",
		Long: `Open a StreamRateLimitQuotas stream to a running Sluice, report each --bucket
as Envoy's rate_limit_quota filter does (at once, as its first request, then
every --report-interval with --rate requests a second), and print every
action Sluice sends back: a token bucket (tokens a second, burst, time to
live), DENY_ALL, ALLOW_ALL or an abandon. Each --bucket is one BucketId, its
keys written key=value and separated by commas. The requests it reports are
counted as allowed: the tokens of the assignments it gets are taken from
the shared buckets like any Envoy's.`,
		Example: `  sluice quota watch --domain quota --bucket api=search,tenant=acme
  sluice quota watch --grpc-addr sluice:8081 --domain quota --bucket api=search --rate 50 --duration 1m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ids, err := o.ids()
			if err != nil {
				return usageError{err}
			}
			creds, err := o.tls.transport()
			if err != nil {
				return err
			}
			addr := localAddr(o.addr, "localhost")
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				return fmt.Errorf("connecting to %s: %w", addr, err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), o.duration)
			defer cancel()
			err = watchQuota(ctx, conn, o, ids, cmd.OutOrStdout())
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil // --duration is up
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "grpc-addr", ":8081", "Sluice's gRPC address, as given to serve (an empty host is localhost)")
	f.StringVar(&o.domain, "domain", "", "the quota filter's domain: a domain of the rule files (required)")
	f.StringArrayVar(&o.buckets, "bucket", nil, "a BucketId as key=value[,key=value...]; repeat for several")
	f.Float64Var(&o.rate, "rate", 1, "requests a second reported for each bucket")
	f.DurationVar(&o.interval, "report-interval", 5*time.Second, "how often to report (Envoy's filter: every 5 s)")
	f.DurationVar(&o.duration, "duration", 30*time.Second, "how long to watch")
	o.tls.addFlags(f)
	return cmd
}

// ids reads the --bucket flags.
func (o quotaWatchOptions) ids() ([]map[string]string, error) {
	switch {
	case o.domain == "":
		return nil, errors.New("--domain is required")
	case len(o.buckets) == 0:
		return nil, errors.New("give at least one --bucket key=value")
	case o.rate < 0:
		return nil, fmt.Errorf("--rate %v: want 0 or more", o.rate)
	case o.interval < time.Second:
		return nil, fmt.Errorf("--report-interval %v: want at least 1s", o.interval)
	}
	var ids []map[string]string
	for _, text := range o.buckets {
		id := map[string]string{}
		for _, pair := range strings.Split(text, ",") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--bucket %q: want key=value[,key=value...]", text)
			}
			id[k] = v
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// watchQuota reports ids on one stream until ctx ends, printing every
// action received.
func watchQuota(ctx context.Context, conn *grpc.ClientConn, o quotaWatchOptions, ids []map[string]string, w io.Writer) error {
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return fmt.Errorf("opening a quota stream: %w", err)
	}
	first := &rlqsv3.RateLimitQuotaUsageReports{Domain: o.domain}
	for _, id := range ids {
		first.BucketQuotaUsages = append(first.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1})
	}
	if err := stream.Send(first); err != nil {
		return fmt.Errorf("reporting: %w", err)
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		t := time.NewTicker(o.interval)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				m := &rlqsv3.RateLimitQuotaUsageReports{}
				n := uint64(o.rate * now.Sub(last).Seconds())
				for _, id := range ids {
					m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
						BucketId:    &rlqsv3.BucketId{Bucket: id},
						TimeElapsed: durationpb.New(now.Sub(last).Truncate(time.Second)), NumRequestsAllowed: n})
				}
				last = now
				if err := stream.Send(m); err != nil {
					errc <- fmt.Errorf("reporting: %w", err)
					return
				}
			}
		}
	}()
	for {
		resp, err := stream.Recv()
		if err != nil {
			select {
			case e := <-errc:
				return e
			default:
			}
			// The stream carries --duration as its deadline, and the
			// server may end it on that deadline a moment before ctx's own
			// timer fires here: either way, --duration is up.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if status.Code(err) == codes.DeadlineExceeded {
				return context.DeadlineExceeded
			}
			return fmt.Errorf("quota stream: %w", err)
		}
		for _, a := range resp.GetBucketAction() {
			fmt.Fprintf(w, "%6.1fs  %s  %s\n", time.Since(start).Seconds(), formatID(a.GetBucketId().GetBucket()), formatAction(a))
		}
	}
}

// formatID writes a BucketId as key=value pairs in key order.
func formatID(id map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(id)) {
		parts = append(parts, k+"="+id[k])
	}
	return strings.Join(parts, ",")
}

// formatAction says what one bucket action tells Envoy to do.
func formatAction(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	if a.GetAbandonAction() != nil {
		return "abandon"
	}
	qa := a.GetQuotaAssignmentAction()
	ttl := qa.GetAssignmentTimeToLive().AsDuration()
	s := qa.GetRateLimitStrategy()
	if tb := s.GetTokenBucket(); tb != nil {
		return fmt.Sprintf("token_bucket %d per %v, burst %d, for %v",
			tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), tb.GetMaxTokens(), ttl)
	}
	return fmt.Sprintf("%s for %v", s.GetBlanketRule(), ttl)
}
