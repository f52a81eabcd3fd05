package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/manifest"
)

const limitsHelp = `Limits are stored at four levels, and a bucket uses the first that has any:
the entity's config for the resource, the entity's config for _default_, the
resource default, the system default. These commands read and write the
records directly, in the DynamoDB table (--backend dynamodb, the default,
with --table) or in Redis (--backend redis with --redis-url); no running
Sluice is needed. A change reaches every replica within its config cache TTL
(60 s), and an existing bucket takes the new limits on its next write.

A limit is written name=rate[:burst=N][:cost=hits|request][:debt=N][:period=P][:zone=Z]:
rpm=100/min, tpm=100000/min:burst=150000, or rpm=20/min:cost=request to count
requests beside a token budget. The rate is N/unit or N/Kunit (s, min, h, day,
week, month, year); the burst defaults to N; debt, how far below zero a charge
after the response may take the limit, defaults to the burst (0: never).
With a period (day, week, month or year) the limit is a budget for that
calendar period in zone Z (default UTC), given in full at each period's start:
month=10000000:period=month:zone=Europe/Berlin.`

func newLimitsCommand() *cobra.Command {
	return newAdminGroup(&cobra.Command{
		Use:   "limits",
		Short: "Set, show and delete limits at the four levels, by hand or from a manifest",
		Long:  limitsHelp,
		Example: `  export SLUICE_TABLE=sluice
  sluice limits set --entity acme --resource chat rpm=200/min
  sluice limits get --entity acme --resource chat
  sluice limits apply -f limits.yaml --dry-run
  sluice limits list --backend redis --redis-url redis://localhost:6379`,
	},
		newLimitsSetCommand, newLimitsGetCommand, newLimitsDeleteCommand, newLimitsListCommand, newLimitsApplyCommand)
}

// configOut is a stored record in json and yaml.
type configOut struct {
	Record recordOut  `json:"record" yaml:"record"`
	Limits []limitOut `json:"limits" yaml:"limits"`
	TTL    string     `json:"ttl,omitempty" yaml:"ttl,omitempty"`
}

func configsOut(cs []backend.Config) []configOut {
	out := make([]configOut, 0, len(cs))
	for _, c := range cs {
		out = append(out, configOut{keyOut(c.Key), limitsOut(c.Limits), ttlOut(c.TTL)})
	}
	return out
}

func newLimitsSetCommand(o *adminOptions) *cobra.Command {
	var s scopeOptions
	var syncWindow time.Duration
	cmd := &cobra.Command{
		Use:   "set (--system | --resource R | --entity E [--resource R]) LIMIT...",
		Short: "Write a record's limits, replacing what it had",
		Long: limitsHelp + `

With --sync-window D an entity config is written as an automated sync would
write it (ADR-128): it expires at now + 3 x D unless written again, and its
buckets expire like those on default limits. Without it the config never
expires, and neither do its buckets.`,
		Example: `  sluice limits set --table sluice --system rpm=1000/min
  sluice limits set --table sluice --resource chat rpm=20/min:cost=request tpm=40000/min:burst=60000
  sluice limits set --table sluice --entity acme rpm=500/min
  sluice limits set --table sluice --entity acme --resource chat rpm=200/min
  sluice limits set --table sluice --entity abuser-42 blocked=0/s
  sluice limits set --table sluice --entity trial-7 --sync-window 1h rpm=10/min`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := s.key()
			if err != nil {
				return err
			}
			if syncWindow < 0 || (syncWindow > 0 && k.Entity == "") {
				return usageError{errors.New("--sync-window takes a positive duration, and only with --entity")}
			}
			var limits []bucket.Limit
			for _, a := range args {
				l, err := bucket.ParseLimit(a)
				if err != nil {
					return usageError{err}
				}
				limits = append(limits, l)
			}
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			c, err := a.PutConfig(cmd.Context(), k, limits, syncWindow)
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), configsOut([]backend.Config{c})[0], func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "set %s: %s (expires: %s)\n", keyText(k), limitsText(c.Limits), ttlText(c.TTL, time.Now()))
			})
		},
	}
	addScopeFlags(cmd, &s)
	cmd.Flags().DurationVar(&syncWindow, "sync-window", 0, "write a sync-written entity config that expires after 3 x this window")
	return cmd
}

// levelOut is one level of a resolution in json and yaml.
type levelOut struct {
	Record  recordOut  `json:"record" yaml:"record"`
	Found   bool       `json:"found" yaml:"found"`
	InForce bool       `json:"in_force" yaml:"in_force"`
	Limits  []limitOut `json:"limits,omitempty" yaml:"limits,omitempty"`
	TTL     string     `json:"ttl,omitempty" yaml:"ttl,omitempty"`
}

// resolutionOut is what `limits get` shows.
type resolutionOut struct {
	Level  string     `json:"level" yaml:"level"`
	Limits []limitOut `json:"limits" yaml:"limits"`
	Levels []levelOut `json:"levels" yaml:"levels"`
}

// chain lists the records resolution reads for k's scope, in order: for an
// entity and resource all four levels, for a resource its default and the
// system's, for the system its own.
func chain(k backend.RecordKey) []backend.RecordKey {
	switch k.Level() {
	case backend.LevelEntity:
		return []backend.RecordKey{k, backend.EntityKey(k.Entity, backend.DefaultResource), backend.ResourceKey(k.Resource), backend.SystemKey()}
	case backend.LevelEntityDefault:
		return []backend.RecordKey{k, backend.SystemKey()}
	case backend.LevelResource:
		return []backend.RecordKey{k, backend.SystemKey()}
	}
	return []backend.RecordKey{k}
}

func newLimitsGetCommand(o *adminOptions) *cobra.Command {
	var s scopeOptions
	cmd := &cobra.Command{
		Use:   "get (--system | --resource R | --entity E [--resource R])",
		Short: "Show the limits in force for a scope, and the level they come from",
		Long: `Show the limits a bucket in this scope gets from the table (or Redis), and
from which level: every level resolution reads is listed, the one in force
marked. For --entity E --resource R that is all four levels; for --entity E
alone, the entity-wide config (_default_) and the system default; for
--resource R, the resource default and the system default. The rule files'
own limits for a resource are not in the table; serve puts them after the
resource default and before the system default. So where the table's answer
is the system default, or nothing, the rule files' limits apply if the rule
has any.`,
		Example: `  sluice limits get --table sluice --entity acme --resource chat
  sluice limits get --table sluice --resource chat -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, k, err := o.scoped(cmd.Context(), s)
			if err != nil {
				return err
			}
			levels := chain(k)
			found, err := a.GetConfigs(cmd.Context(), levels)
			if err != nil {
				return err
			}
			res := resolutionOut{Level: backend.LevelNone.String(), Limits: []limitOut{}}
			for _, ck := range levels {
				c, ok := found[ck]
				row := levelOut{Record: keyOut(ck), Found: ok}
				if ok {
					row.Limits, row.TTL = limitsOut(c.Limits), ttlOut(c.TTL)
					if res.Level == backend.LevelNone.String() {
						row.InForce = true
						res.Level, res.Limits = ck.Level().String(), row.Limits
					}
				}
				res.Levels = append(res.Levels, row)
			}
			return o.print(cmd.OutOrStdout(), res, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "LEVEL\tRECORD\tLIMITS\tEXPIRES")
				for i, r := range res.Levels {
					c, ttl := found[levels[i]], "-"
					if r.Found {
						ttl = ttlText(c.TTL, time.Now())
					}
					if r.InForce {
						ttl += "\t<- in force"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.Record.Level, keyText(levels[i]), limitsText(c.Limits), ttl)
				}
				switch res.Level {
				case backend.LevelNone.String():
					fmt.Fprintln(w, "no level has limits in the table: the rule files' limits apply, if any")
				case backend.LevelSystem.String():
					fmt.Fprintln(w, "the system default applies only where the rule files give the resource no limits")
				}
			})
		},
	}
	addScopeFlags(cmd, &s)
	return cmd
}

func newLimitsDeleteCommand(o *adminOptions) *cobra.Command {
	var s scopeOptions
	cmd := &cobra.Command{
		Use:   "delete (--system | --resource R | --entity E [--resource R])",
		Short: "Delete one record; the next level down takes over",
		Example: `  sluice limits delete --table sluice --entity acme --resource chat
  sluice limits delete --table sluice --resource chat`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, k, err := o.scoped(cmd.Context(), s)
			if err != nil {
				return err
			}
			existed, err := a.DeleteConfig(cmd.Context(), k)
			if err != nil {
				return err
			}
			if !existed {
				return notFound("%s: no such record", keyText(k))
			}
			return o.print(cmd.OutOrStdout(), map[string]any{"deleted": keyOut(k)}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "deleted %s\n", keyText(k))
			})
		},
	}
	addScopeFlags(cmd, &s)
	return cmd
}

func newLimitsListCommand(o *adminOptions) *cobra.Command {
	var entity string
	cmd := &cobra.Command{
		Use:   "list [--entity E]",
		Short: "List stored records: one entity's, or every one in the table (or Redis)",
		Long: `With --entity, list that entity's configs (one Query). Without it, list every
record of the deployment: that scans the whole table, buckets included, so it
takes time and read capacity in proportion to the table's size. On Redis both
are a SCAN of the keyspace (of every primary of a Cluster), which takes time in
proportion to the number of keys.`,
		Example: `  sluice limits list --table sluice --entity acme
  sluice limits list --table sluice -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			var cs []backend.Config
			if entity != "" {
				cs, err = a.EntityConfigs(cmd.Context(), entity)
			} else {
				err = a.AllConfigs(cmd.Context(), func(c backend.Config) error {
					cs = append(cs, c)
					return nil
				})
			}
			if err != nil {
				return err
			}
			slices.SortFunc(cs, func(x, y backend.Config) int { return manifest.CompareKeys(x.Key, y.Key) })
			return o.print(cmd.OutOrStdout(), configsOut(cs), func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "LEVEL\tRECORD\tLIMITS\tEXPIRES")
				for _, c := range cs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", c.Key.Level(), keyText(c.Key), limitsText(c.Limits), ttlText(c.TTL, time.Now()))
				}
			})
		},
	}
	cmd.Flags().StringVar(&entity, "entity", "", "list only this entity's configs")
	return cmd
}

// changeOut is one step of an apply in json and yaml.
type changeOut struct {
	Action string     `json:"action" yaml:"action"`
	Record recordOut  `json:"record" yaml:"record"`
	Old    []limitOut `json:"old,omitempty" yaml:"old,omitempty"`
	New    []limitOut `json:"new,omitempty" yaml:"new,omitempty"`
}

type applyOut struct {
	Changes []changeOut `json:"changes" yaml:"changes"`
	DryRun  bool        `json:"dry_run" yaml:"dry_run"`
	Applied bool        `json:"applied" yaml:"applied"`
}

func newLimitsApplyCommand(o *adminOptions) *cobra.Command {
	var file string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE [--dry-run]",
		Short: "Make the table (or Redis) hold exactly a manifest's records",
		Long: `Read a manifest of system, resource and entity limits, print the plan (create,
update, delete) and carry it out. Records the manifest lists are written as
operator configs (no expiry). A record is deleted only if an earlier apply's
manifest listed it and this one no longer does: configs written by hand or by
a sync job are never touched unless a manifest names them. Applying the same
manifest again changes nothing. Two applies at once: the second to finish
fails and says so; run it again. -f - reads the manifest from stdin.

  system:
    - {name: rpm, rate: 1000/min}
  resources:
    chat:
      - {name: rpm, rate: 20/min, cost: request}
      - {name: tpm, rate: 40000/min, burst: 60000}
  entities:
    acme:
      _default_:
        - {name: rpm, rate: 500/min}`,
		Example: `  sluice limits apply --table sluice -f limits.yaml --dry-run
  sluice limits apply --table sluice -f limits.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usageError{errors.New("-f FILE is required")}
			}
			var data []byte
			var err error
			if file == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return err
			}
			m, err := manifest.Parse(file, data)
			if err != nil {
				return err
			}
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			applied, version, err := a.Applied(ctx)
			if err != nil {
				return err
			}
			stored, err := a.GetConfigs(ctx, append(m.Keys(), applied...))
			if err != nil {
				return err
			}
			current := make(map[backend.RecordKey]manifest.Current, len(stored))
			for k, c := range stored {
				current[k] = manifest.Current{Limits: c.Limits, Synced: c.TTL != 0}
			}
			plan := manifest.Plan(m, current, applied)
			res := applyOut{Changes: []changeOut{}, DryRun: dryRun}
			changed := false
			for _, c := range plan {
				res.Changes = append(res.Changes, changeOut{c.Action.String(), keyOut(c.Key), limitsOut(c.Old), limitsOut(c.New)})
				changed = changed || c.Action != manifest.Unchanged
			}
			if !dryRun {
				for _, c := range plan {
					switch c.Action {
					case manifest.Create, manifest.Update:
						_, err = a.PutConfig(ctx, c.Key, c.New, 0)
					case manifest.Delete:
						_, err = a.DeleteConfig(ctx, c.Key)
					}
					if err != nil {
						return fmt.Errorf("%s %s: %w (the steps before it are done; apply again)", c.Action, keyText(c.Key), err)
					}
				}
				if changed || !sameKeys(applied, m.Keys()) {
					if err := a.SetApplied(ctx, m.Keys(), version); err != nil {
						if errors.Is(err, backend.ErrAppliedChanged) {
							return fmt.Errorf("%w: apply again to reconcile", err)
						}
						return err
					}
				}
				res.Applied = true
			}
			return o.print(cmd.OutOrStdout(), res, func(w *tabwriter.Writer) {
				unchanged := 0
				for _, c := range plan {
					switch c.Action {
					case manifest.Unchanged:
						unchanged++
					case manifest.Create:
						fmt.Fprintf(w, "+ create\t%s\t%s\n", keyText(c.Key), limitsText(c.New))
					case manifest.Update:
						fmt.Fprintf(w, "~ update\t%s\t%s -> %s\n", keyText(c.Key), limitsText(c.Old), limitsText(c.New))
					case manifest.Delete:
						fmt.Fprintf(w, "- delete\t%s\t%s\n", keyText(c.Key), limitsText(c.Old))
					}
				}
				verb := "applied"
				if dryRun {
					verb = "dry run, nothing written"
				}
				fmt.Fprintf(w, "%d to change, %d unchanged (%s)\n", len(plan)-unchanged, unchanged, verb)
			})
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "the manifest (- for stdin)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan only")
	return cmd
}

func sameKeys(a, b []backend.RecordKey) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[backend.RecordKey]bool{}
	for _, k := range a {
		set[k] = true
	}
	for _, k := range b {
		if !set[k] {
			return false
		}
	}
	return true
}
