package main

import (
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

func newBucketsCommand() *cobra.Command {
	return newAdminGroup(&cobra.Command{
		Use:   "buckets",
		Short: "Look at token buckets as the table (or Redis) holds them",
		Long: `A bucket is one entity's state for one resource: for each of its limits the
tokens left at its refill clock. get and list only read; a bucket changes when
Sluice decides on it, or when reset makes it full again.`,
		Example: `  export SLUICE_TABLE=sluice
  sluice buckets get --entity acme --resource chat
  sluice buckets list --resource chat --limit 20
  sluice buckets reset --entity acme --resource chat --limit tpm`,
	},
		newBucketsGetCommand, newBucketsListCommand, newBucketsResetCommand)
}

// bucketLimitOut is one limit of a bucket in json and yaml.
type bucketLimitOut struct {
	limitOut `yaml:",inline"`
	// Tokens now, with the refill since the last write applied.
	Tokens   float64 `json:"tokens" yaml:"tokens"`
	Consumed float64 `json:"consumed" yaml:"consumed"`
	// Budget is, for a budget, the period in force and what of it is
	// used and left.
	Budget *budgetOut `json:"budget,omitempty" yaml:"budget,omitempty"`
}

// budgetOut is a budget's current period: its bounds in its zone, what
// is used of it (the budget less what is left: tokens out on lease and
// a debt carried from the period before count as used) and what is left
// (below zero in debt).
type budgetOut struct {
	Start string  `json:"start" yaml:"start"`
	End   string  `json:"end" yaml:"end"`
	Used  float64 `json:"used" yaml:"used"`
	Left  float64 `json:"left" yaml:"left"`
}

// budgetOf is l's period at now and what s, refilled to now, leaves of
// it; nil for a rate.
func budgetOf(l bucket.Limit, s bucket.State, now int64) *budgetOut {
	if !l.IsBudget() {
		return nil
	}
	p := bucket.Periods(l, now)
	in := func(ms int64) string { return time.UnixMilli(ms).In(l.Zone).Format(time.RFC3339) }
	return &budgetOut{Start: in(p.Start), End: in(p.End),
		Used: float64(l.Amount-s.Tokens) / bucket.Milli, Left: float64(s.Tokens) / bucket.Milli}
}

type bucketOut struct {
	Entity   string           `json:"entity" yaml:"entity"`
	Resource string           `json:"resource" yaml:"resource"`
	Limits   []bucketLimitOut `json:"limits" yaml:"limits"`
	TTL      string           `json:"ttl,omitempty" yaml:"ttl,omitempty"`
	// Source is the level the limits come from now, per the table.
	Source string `json:"source" yaml:"source"`
	// Stale: the limits in force differ from those the bucket was last
	// written with; its next write brings it in line. Always false where
	// the table's answer is the system default or nothing, as the rule
	// files may decide there.
	Stale bool `json:"stale" yaml:"stale"`
}

func milliText(v int64) string {
	return strconv.FormatFloat(float64(v)/bucket.Milli, 'f', -1, 64)
}

// sourceText says where a bucket's limits come from and so what its TTL
// follows (ADR-119, ADR-128).
func sourceText(r backend.Resolved) string {
	switch {
	case r.Level == backend.LevelEntity && r.Synced:
		return "sync-written entity config: expires after its time to fill x the TTL multiplier"
	case r.Level == backend.LevelEntity:
		return "operator-written entity config: never expires"
	case r.Level == backend.LevelNone:
		return "the rule files (no record in the table): expires after its time to fill x the TTL multiplier"
	case r.Level == backend.LevelSystem:
		// The rule files' limits come before the system default, and
		// they are not in the table.
		return "the rule files' limits for the resource if any, else the system default: expires after its time to fill x the TTL multiplier"
	}
	return r.Level.String() + " default: expires after its time to fill x the TTL multiplier"
}

func newBucketsGetCommand(o *adminOptions) *cobra.Command {
	var entity, resource string
	cmd := &cobra.Command{
		Use:   "get --entity E --resource R",
		Short: "Show a bucket: tokens now, burst, rate, TTL and where its limits come from",
		Example: `  sluice buckets get --table sluice --entity acme --resource chat
  sluice buckets get --table sluice --entity 203.0.113.7 --resource edge/remote_address -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if entity == "" || resource == "" {
				return usageError{errors.New("--entity and --resource are required")}
			}
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			b, ok, err := a.GetBucket(cmd.Context(), entity, resource)
			if err != nil {
				return err
			}
			if !ok {
				return notFound("no bucket for entity %s resource %s (never used, or expired)", entity, resource)
			}
			r, err := a.Effective(cmd.Context(), entity, resource)
			if err != nil {
				return err
			}
			now := time.Now()
			out := bucketOut{Entity: entity, Resource: resource, TTL: ttlOut(b.TTL), Source: sourceText(r),
				// Below the resource default the rule files may decide, and
				// they are not known here: no verdict then.
				Stale: r.Level != backend.LevelNone && r.Level != backend.LevelSystem && bucket.Fingerprint(r.Limits) != b.Cfg}
			nowStates := make([]bucket.State, len(b.Limits))
			for i, l := range b.Limits {
				nowStates[i] = bucket.Refill(l, b.States[i], now.UnixMilli())
				out.Limits = append(out.Limits, bucketLimitOut{limitsOut([]bucket.Limit{l})[0],
					float64(nowStates[i].Tokens) / bucket.Milli, float64(nowStates[i].Consumed) / bucket.Milli,
					budgetOf(l, nowStates[i], now.UnixMilli())})
			}
			return o.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "bucket of entity %s for resource %s\n", entity, resource)
				fmt.Fprintf(w, "limits from: %s\n", out.Source)
				fmt.Fprintf(w, "expires: %s\n", ttlText(b.TTL, now))
				if out.Stale {
					fmt.Fprintln(w, "stale: the limits in force changed since its last write, which will apply them")
				}
				fmt.Fprintln(w, "LIMIT\tRATE\tBURST\tTOKENS\tCONSUMED")
				for i, l := range b.Limits {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", l.Name, bucket.FormatRate(l.Amount, l.Period),
						milliText(l.Burst), milliText(nowStates[i].Tokens), milliText(nowStates[i].Consumed))
				}
				for i, l := range b.Limits {
					if bo := out.Limits[i].Budget; bo != nil {
						fmt.Fprintf(w, "budget %s: a %s in %s, %s to %s: used %s, left %s\n", l.Name, l.Calendar, l.ZoneName(),
							bo.Start, bo.End, milliText(l.Amount-nowStates[i].Tokens), milliText(nowStates[i].Tokens))
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&entity, "entity", "", "the entity (required)")
	cmd.Flags().StringVar(&resource, "resource", "", "the resource (required)")
	return cmd
}

func newBucketsResetCommand(o *adminOptions) *cobra.Command {
	var entity, resource, limit string
	cmd := &cobra.Command{
		Use:   "reset --entity E --resource R [--limit NAME]",
		Short: "Make a bucket full again: every limit, or the one named",
		Long: `Make the bucket of one entity for one resource full again, as a bucket seen for
the first time: every limit, or with --limit only that one (the others stay as
they are). Debt is forgiven and the consumed totals of what is reset start
again. Both --entity and --resource are required, exactly: a reset never
reaches more than one bucket. Tokens that replicas hold on lease stay theirs.
Prints what the bucket held before.`,
		Example: `  sluice buckets reset --table sluice --entity acme --resource chat
  sluice buckets reset --table sluice --entity acme --resource chat --limit tpm`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if entity == "" || resource == "" {
				return usageError{errors.New("--entity and --resource are required: a reset names exactly one bucket")}
			}
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			b, ok, err := a.ResetBucket(cmd.Context(), entity, resource, limit)
			if err != nil {
				return err
			}
			if !ok {
				return notFound("no bucket for entity %s resource %s (never used, or expired): nothing to reset", entity, resource)
			}
			now := time.Now()
			out := bucketOut{Entity: entity, Resource: resource, TTL: ttlOut(b.TTL)}
			for i, l := range b.Limits {
				if limit == "" || l.Name == limit {
					s := bucket.Refill(l, b.States[i], now.UnixMilli())
					out.Limits = append(out.Limits, bucketLimitOut{limitsOut([]bucket.Limit{l})[0],
						float64(s.Tokens) / bucket.Milli, float64(s.Consumed) / bucket.Milli, budgetOf(l, s, now.UnixMilli())})
				}
			}
			return o.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "reset the bucket of entity %s for resource %s; before, it held:\n", entity, resource)
				fmt.Fprintln(w, "LIMIT\tRATE\tBURST\tTOKENS\tCONSUMED")
				for _, l := range out.Limits {
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", l.Name, l.Rate, l.Burst,
						strconv.FormatFloat(l.Tokens, 'f', -1, 64), strconv.FormatFloat(l.Consumed, 'f', -1, 64))
				}
			})
		},
	}
	cmd.Flags().StringVar(&entity, "entity", "", "the entity (required)")
	cmd.Flags().StringVar(&resource, "resource", "", "the resource (required)")
	cmd.Flags().StringVar(&limit, "limit", "", "reset only the limit of this name (default: every limit)")
	return cmd
}

func newBucketsListCommand(o *adminOptions) *cobra.Command {
	var resource string
	var limit int
	cmd := &cobra.Command{
		Use:   "list --resource R [--limit N]",
		Short: "List the buckets of a resource",
		Long: `List the entities holding a bucket for a resource, through the table's GSI2
index, page by page, with the fingerprint of the limits each was last written
with. The index is eventually consistent, and lists an expired bucket until
DynamoDB deletes it. On Redis the buckets are found by SCAN, in no particular
order, in time proportional to the number of keys.`,
		Example: `  sluice buckets list --table sluice --resource chat --limit 100`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if resource == "" {
				return usageError{errors.New("--resource is required")}
			}
			if limit < 0 {
				return usageError{errors.New("--limit must be 0 (all) or more")}
			}
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			type refOut struct {
				Entity string `json:"entity" yaml:"entity"`
				Cfg    string `json:"cfg" yaml:"cfg"`
			}
			out := []refOut{}
			errEnough := errors.New("enough")
			err = a.Buckets(cmd.Context(), resource, func(r backend.BucketRef) error {
				out = append(out, refOut{r.Entity, r.Cfg})
				if limit > 0 && len(out) >= limit {
					return errEnough
				}
				return nil
			})
			if err != nil && !errors.Is(err, errEnough) {
				return err
			}
			return o.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ENTITY\tCFG")
				for _, r := range out {
					fmt.Fprintf(w, "%s\t%s\n", r.Entity, r.Cfg)
				}
			})
		},
	}
	cmd.Flags().StringVar(&resource, "resource", "", "the resource (required)")
	cmd.Flags().IntVar(&limit, "limit", 0, "stop after this many buckets (0: all)")
	return cmd
}
