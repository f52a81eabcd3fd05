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
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/internal/callgate"
)

// adminStore is what the operator commands need of the store a
// deployment keeps its limits and buckets in: the config records of the
// four levels, entities' META, buckets (read only) and the applied set of
// `limits apply`. *dynamodb.Admin and *redis.Admin are each one.
type adminStore interface {
	PutConfig(ctx context.Context, k backend.RecordKey, limits []bucket.Limit, syncWindow time.Duration) (backend.Config, error)
	GetConfigs(ctx context.Context, keys []backend.RecordKey) (map[backend.RecordKey]backend.Config, error)
	DeleteConfig(ctx context.Context, k backend.RecordKey) (bool, error)
	EntityConfigs(ctx context.Context, entity string) ([]backend.Config, error)
	AllConfigs(ctx context.Context, fn func(backend.Config) error) error
	Applied(ctx context.Context) ([]backend.RecordKey, int64, error)
	SetApplied(ctx context.Context, refs []backend.RecordKey, version int64) error

	PutEntity(ctx context.Context, e backend.Entity) error
	GetEntity(ctx context.Context, name string) (backend.Entity, bool, error)
	Children(ctx context.Context, parent string, fn func(backend.Entity) error) error
	DeleteEntity(ctx context.Context, entity string) (int, error)

	GetBucket(ctx context.Context, entity, resource string) (backend.Bucket, bool, error)
	ResetBucket(ctx context.Context, entity, resource, limit string) (backend.Bucket, bool, error)
	Effective(ctx context.Context, entity, resource string) (backend.Resolved, error)
	Buckets(ctx context.Context, resource string, fn func(backend.BucketRef) error) error
}

var (
	_ adminStore = (*sluiceddb.Admin)(nil)
	_ adminStore = (*redis.Admin)(nil)
)

// adminOptions are the flags every operator command shares: which store
// and where it is, and how to print.
type adminOptions struct {
	backend                            string
	table, region, endpoint, keyPrefix string
	redis                              redis.Conn
	output                             string
	// release frees what admin connected (the Redis client); the group
	// calls it when its command ends, whatever the outcome.
	release func()
}

// newAdminGroup is a command group of operator commands sharing the
// store and output flags; each sub is built on the group's options.
func newAdminGroup(group *cobra.Command, subs ...func(*adminOptions) *cobra.Command) *cobra.Command {
	o := &adminOptions{}
	group.Args = cobra.NoArgs
	group.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	addAdminFlags(group, o)
	for _, sub := range subs {
		c := sub(o)
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error {
				defer o.close()
				return run(cmd, args)
			}
		}
		group.AddCommand(c)
	}
	return group
}

// addAdminFlags defines the shared flags on a command group; they are
// persistent, so `sluice limits set --table T` works.
func addAdminFlags(cmd *cobra.Command, o *adminOptions) {
	f := cmd.PersistentFlags()
	addStoreFlags(f, o)
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
}

// addStoreFlags defines the flags that say where the deployment's store
// is, as serve was given it.
func addStoreFlags(f *pflag.FlagSet, o *adminOptions) {
	f.StringVar(&o.backend, "backend", "dynamodb", "where the deployment keeps its limits and buckets: dynamodb or redis (as given to serve)")
	f.StringVar(&o.table, "table", "", "dynamodb backend: the table (required)")
	addDynamoDBFlags(f, &o.region, &o.endpoint)
	addRedisFlags(f, &o.redis)
	f.StringVar(&o.keyPrefix, "key-prefix", "", "the key prefix of the deployment (as given to serve)")
}

// redisDialTimeout bounds connecting to Redis, as serve bounds it.
const redisDialTimeout = 10 * time.Second

// admin connects to the store --backend names.
func (o *adminOptions) admin(ctx context.Context) (adminStore, error) {
	switch o.backend {
	case "dynamodb":
		if o.table == "" {
			return nil, usageError{errors.New("--table (or SLUICE_TABLE) is required")}
		}
	case "redis":
		if o.redis.URL == "" {
			return nil, usageError{errRedisURL}
		}
	default:
		return nil, usageError{fmt.Errorf("--backend %q: want dynamodb or redis (the memory backend keeps its limits in its overrides file)", o.backend)}
	}
	switch o.output {
	case "table", "json", "yaml":
	default:
		return nil, usageError{fmt.Errorf("--output %q: want table, json or yaml", o.output)}
	}
	if o.backend == "redis" {
		return o.redisAdmin(ctx)
	}
	client, err := newDynamoDBClient(ctx, o.region, o.endpoint, nil)
	if err != nil {
		return nil, err
	}
	// Queries go a few at a time (callgate): a sync's usage read of its
	// own region is sixteen at once otherwise, and the replicas' writes
	// to this table wait behind them. The other commands query one page
	// after another, which the gate never holds up.
	a, err := sluiceddb.NewAdmin(callgate.DynamoDB(client, callgate.New(callgate.SyncQueries)), o.table, o.keyPrefix, nil)
	if err != nil {
		return nil, usageError{err}
	}
	return a, nil
}

// redisAdmin dials Redis; the client is closed when the command ends.
func (o *adminOptions) redisAdmin(ctx context.Context) (adminStore, error) {
	// A bad prefix is a usage error, found before any connection.
	if _, err := redis.NewKeys(o.keyPrefix); err != nil {
		return nil, usageError{err}
	}
	dialCtx, cancel := context.WithTimeout(ctx, redisDialTimeout)
	defer cancel()
	client, err := dialRedis(dialCtx, o.redis)
	if err != nil {
		return nil, err
	}
	a, err := redis.NewAdmin(client, o.keyPrefix, nil)
	if err != nil {
		client.Close()
		return nil, usageError{err}
	}
	o.release = client.Close
	return a, nil
}

// close releases what admin connected, if anything.
func (o *adminOptions) close() {
	if o.release != nil {
		o.release()
		o.release = nil
	}
}

// scoped checks the scope flags, then connects.
func (o *adminOptions) scoped(ctx context.Context, s scopeOptions) (adminStore, backend.RecordKey, error) {
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
	// Period and Zone make the limit a budget for a calendar period,
	// as the keys of a rule file's limits entry do.
	Period string `json:"period,omitempty" yaml:"period,omitempty"`
	Zone   string `json:"zone,omitempty" yaml:"zone,omitempty"`
}

func limitsOut(ls []bucket.Limit) []limitOut {
	out := make([]limitOut, 0, len(ls))
	for _, l := range ls {
		cost := "hits"
		if l.PerRequest {
			cost = "request"
		}
		lo := limitOut{Name: l.Name, Rate: bucket.FormatRate(l.Amount, l.Period), Burst: l.Burst / bucket.Milli, Cost: cost}
		if l.IsBudget() {
			lo.Period, lo.Zone = l.Calendar.String(), l.ZoneName()
		}
		out = append(out, lo)
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
