package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/backend"
)

func newEntityCommand() *cobra.Command {
	return newAdminGroup(&cobra.Command{
		Use:   "entity",
		Short: "Manage entities: parents, cascades, and deleting everything an entity has",
		Long: `An entity (an API key, a tenant, a client address) may have a parent. With
cascade on, each of its requests is charged to its own bucket and to the
parent's bucket for the same resource, atomically: a team's keys share the
team's budget. These commands read and write the DynamoDB table (--backend
dynamodb, the default, with --table) or Redis (--backend redis with
--redis-url) directly.`,
		Example: `  export SLUICE_TABLE=sluice
  sluice entity set key-123 --parent team-a --cascade
  sluice entity children team-a`,
	},
		newEntitySetCommand, newEntityGetCommand, newEntityChildrenCommand, newEntityDeleteCommand)
}

// entityOut is an entity in json and yaml.
type entityOut struct {
	Entity  string      `json:"entity" yaml:"entity"`
	Parent  string      `json:"parent,omitempty" yaml:"parent,omitempty"`
	Cascade bool        `json:"cascade" yaml:"cascade"`
	Configs []configOut `json:"configs,omitempty" yaml:"configs,omitempty"`
}

func newEntitySetCommand(o *adminOptions) *cobra.Command {
	var parent string
	var cascade bool
	cmd := &cobra.Command{
		Use:   "set ENTITY [--parent P] [--cascade]",
		Short: "Set an entity's parent and whether its requests are charged to it too",
		Example: `  sluice entity set --table sluice key-123 --parent team-a --cascade
  sluice entity set --table sluice key-123             # no parent any more`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			e := backend.Entity{Name: args[0], Parent: parent, Cascade: cascade}
			if cascade && parent == "" {
				return usageError{errors.New("--cascade needs --parent")}
			}
			if parent == args[0] {
				return usageError{errors.New("an entity cannot be its own parent")}
			}
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			if err := a.PutEntity(cmd.Context(), e); err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), entityOut{Entity: e.Name, Parent: e.Parent, Cascade: e.Cascade}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "set entity %s: %s\n", e.Name, describeParent(e))
			})
		},
	}
	cmd.Flags().StringVar(&parent, "parent", "", "the parent entity")
	cmd.Flags().BoolVar(&cascade, "cascade", false, "charge the entity's requests to the parent too")
	return cmd
}

func describeParent(e backend.Entity) string {
	switch {
	case e.Parent == "":
		return "no parent"
	case e.Cascade:
		return "parent " + e.Parent + ", cascade (charged to the parent too)"
	}
	return "parent " + e.Parent + ", no cascade"
}

func newEntityGetCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "get ENTITY",
		Short:   "Show an entity's parent, cascade and configs",
		Example: `  sluice entity get --table sluice key-123`,
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			e, found, err := a.GetEntity(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			configs, err := a.EntityConfigs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !found && len(configs) == 0 {
				return notFound("entity %s: no META item and no configs", args[0])
			}
			e.Name = args[0]
			return o.print(cmd.OutOrStdout(), entityOut{e.Name, e.Parent, e.Cascade, configsOut(configs)}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "entity %s: %s\n", e.Name, describeParent(e))
				if len(configs) > 0 {
					fmt.Fprintln(w, "RESOURCE\tLIMITS\tEXPIRES")
				}
				for _, c := range configs {
					fmt.Fprintf(w, "%s\t%s\t%s\n", c.Key.Resource, limitsText(c.Limits), ttlText(c.TTL, time.Now()))
				}
			})
		},
	}
	return cmd
}

func newEntityChildrenCommand(o *adminOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "children PARENT",
		Short: "List the entities whose parent is PARENT",
		Long: `List the entities whose parent is PARENT, through the table's GSI1 index,
page by page. The index is eventually consistent: an entity set a moment ago
may not be listed yet. On Redis, which has no index, every entity's META is
found by SCAN and read, in time proportional to the number of keys; an entity
set a moment ago is listed.`,
		Example: `  sluice entity children --table sluice team-a`,
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			out := []entityOut{}
			if err := a.Children(cmd.Context(), args[0], func(e backend.Entity) error {
				out = append(out, entityOut{Entity: e.Name, Parent: e.Parent, Cascade: e.Cascade})
				return nil
			}); err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ENTITY\tCASCADE")
				for _, e := range out {
					fmt.Fprintf(w, "%s\t%v\n", e.Entity, e.Cascade)
				}
			})
		},
	}
	return cmd
}

func newEntityDeleteCommand(o *adminOptions) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "delete ENTITY [--force]",
		Short: "Delete an entity: its META item, its configs and its buckets",
		Long: `Delete every item of an entity: its META item, its configs and its buckets,
25 at a time, retrying what DynamoDB leaves unprocessed; on Redis, its keys,
its configs and buckets found by SCAN. An entity that is the parent of others
is refused unless --force: its children would go on charging a parent whose
limits are gone.`,
		Example: `  sluice entity delete --table sluice key-123`,
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := o.admin(cmd.Context())
			if err != nil {
				return err
			}
			if !force {
				var child string
				errStop := errors.New("stop")
				err := a.Children(cmd.Context(), args[0], func(e backend.Entity) error {
					child = e.Name
					return errStop
				})
				if err != nil && !errors.Is(err, errStop) {
					return err
				}
				if child != "" {
					return fmt.Errorf("entity %s is the parent of %s (and maybe others; see entity children): give --force to delete it anyway", args[0], child)
				}
			}
			n, err := a.DeleteEntity(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if n == 0 {
				return notFound("entity %s: nothing to delete", args[0])
			}
			return o.print(cmd.OutOrStdout(), map[string]any{"entity": args[0], "items_deleted": n}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "deleted entity %s: %d items\n", args[0], n)
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even if the entity is a parent")
	return cmd
}
