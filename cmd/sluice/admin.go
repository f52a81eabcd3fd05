package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
)

// adminOptions are the flags every operator command shares: where the
// table is, and how to print.
type adminOptions struct {
	table, region, endpoint, keyPrefix string
	output                             string
}

// newAdminGroup is a command group of operator commands sharing the
// table and output flags; each sub is built on the group's options.
func newAdminGroup(group *cobra.Command, subs ...func(*adminOptions) *cobra.Command) *cobra.Command {
	o := &adminOptions{}
	group.Args = cobra.NoArgs
	group.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	addAdminFlags(group, o)
	for _, sub := range subs {
		group.AddCommand(sub(o))
	}
	return group
}

// addAdminFlags defines the shared flags on a command group; they are
// persistent, so `sluice limits set --table T` works.
func addAdminFlags(cmd *cobra.Command, o *adminOptions) {
	f := cmd.PersistentFlags()
	f.StringVar(&o.table, "table", "", "DynamoDB table name (required)")
	addDynamoDBFlags(f, &o.region, &o.endpoint)
	f.StringVar(&o.keyPrefix, "key-prefix", "", "the key prefix of the deployment (as given to serve)")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
}

// admin connects to the table.
func (o *adminOptions) admin(ctx context.Context) (*sluiceddb.Admin, error) {
	if o.table == "" {
		return nil, usageError{errors.New("--table (or SLUICE_TABLE) is required")}
	}
	switch o.output {
	case "table", "json", "yaml":
	default:
		return nil, usageError{fmt.Errorf("--output %q: want table, json or yaml", o.output)}
	}
	client, err := newDynamoDBClient(ctx, o.region, o.endpoint, nil)
	if err != nil {
		return nil, err
	}
	a, err := sluiceddb.NewAdmin(client, o.table, o.keyPrefix, nil)
	if err != nil {
		return nil, usageError{err}
	}
	return a, nil
}

// scoped checks the scope flags, then connects.
func (o *adminOptions) scoped(ctx context.Context, s scopeOptions) (*sluiceddb.Admin, backend.RecordKey, error) {
	k, err := s.key()
	if err != nil {
		return nil, k, err
	}
	a, err := o.admin(ctx)
	return a, k, err
}

// print writes v as JSON or YAML, or calls table for the table format.
func (o *adminOptions) print(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	switch o.output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return err
		}
		return enc.Close()
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// notFound is a lookup that found nothing: exit code 1 with a message.
func notFound(format string, args ...any) error { return fmt.Errorf(format, args...) }

// scopeOptions select one record: --system, --resource R, or --entity E
// with an optional --resource (the entity-wide config, _default_, when
// absent).
type scopeOptions struct {
	system           bool
	entity, resource string
}

func addScopeFlags(cmd *cobra.Command, s *scopeOptions) {
	f := cmd.Flags()
	f.BoolVar(&s.system, "system", false, "the system default (level 4)")
	f.StringVar(&s.resource, "resource", "", "the resource default of R (level 3), or with --entity the entity's config for R")
	f.StringVar(&s.entity, "entity", "", "an entity's config (levels 1 and 2); without --resource its entity-wide one, "+backend.DefaultResource)
}

func (s scopeOptions) key() (backend.RecordKey, error) {
	switch {
	case s.system && (s.entity != "" || s.resource != ""):
		return backend.RecordKey{}, usageError{errors.New("--system takes neither --entity nor --resource")}
	case s.system:
		return backend.SystemKey(), nil
	case s.entity != "" && s.resource == "":
		return backend.EntityKey(s.entity, backend.DefaultResource), nil
	case s.entity != "":
		return backend.EntityKey(s.entity, s.resource), nil
	case s.resource != "":
		return backend.ResourceKey(s.resource), nil
	}
	return backend.RecordKey{}, usageError{errors.New("name a record: --system, --resource R, or --entity E [--resource R]")}
}

// limitOut is a limit as the json and yaml outputs show it, in the words
// of the rule files and manifests.
type limitOut struct {
	Name  string `json:"name" yaml:"name"`
	Rate  string `json:"rate" yaml:"rate"`
	Burst int64  `json:"burst" yaml:"burst"`
	Cost  string `json:"cost" yaml:"cost"`
}

func limitsOut(ls []bucket.Limit) []limitOut {
	out := make([]limitOut, 0, len(ls))
	for _, l := range ls {
		cost := "hits"
		if l.PerRequest {
			cost = "request"
		}
		out = append(out, limitOut{l.Name, bucket.FormatRate(l.Amount, l.Period), l.Burst / bucket.Milli, cost})
	}
	return out
}

// limitsText is limits in the compact syntax `limits set` reads.
func limitsText(ls []bucket.Limit) string {
	if len(ls) == 0 {
		return "-"
	}
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.String()
	}
	return strings.Join(parts, " ")
}

// recordOut names a record in json and yaml.
type recordOut struct {
	Level    string `json:"level" yaml:"level"`
	Entity   string `json:"entity,omitempty" yaml:"entity,omitempty"`
	Resource string `json:"resource,omitempty" yaml:"resource,omitempty"`
}

func keyOut(k backend.RecordKey) recordOut {
	return recordOut{Level: k.Level().String(), Entity: k.Entity, Resource: k.Resource}
}

// keyText names a record in tables and plans, unquoted for reading:
// "system", "resource chat", "entity acme resource _default_" (errors use
// RecordKey.String, which quotes the names).
func keyText(k backend.RecordKey) string {
	switch k.Level() {
	case backend.LevelSystem:
		return "system"
	case backend.LevelResource:
		return "resource " + k.Resource
	}
	return "entity " + k.Entity + " resource " + k.Resource
}

// ttlText shows an epoch-seconds ttl for people: "never", or the time and
// how far off it is.
func ttlText(ttl int64, now time.Time) string {
	if ttl == 0 {
		return "never"
	}
	at := time.Unix(ttl, 0).UTC()
	return fmt.Sprintf("%s (in %s)", at.Format(time.RFC3339), at.Sub(now).Truncate(time.Second))
}

// ttlOut is a ttl in json and yaml: RFC 3339, or empty for never.
func ttlOut(ttl int64) string {
	if ttl == 0 {
		return ""
	}
	return time.Unix(ttl, 0).UTC().Format(time.RFC3339)
}
