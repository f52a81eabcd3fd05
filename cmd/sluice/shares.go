package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/regions"
)

type sharesOptions struct {
	regionsOptions
	entity, resource string
	output           string
}

// shareRow is one region's part of a global key, as shares prints it:
// parts of the limit in percent.
type shareRow struct {
	Entity   string   `json:"entity" yaml:"entity"`
	Resource string   `json:"resource" yaml:"resource"`
	Region   string   `json:"region" yaml:"region"`
	Base     float64  `json:"base_percent" yaml:"base_percent"`
	Share    *float64 `json:"share_percent" yaml:"share_percent"`   // null: its record could not be read
	Demand   *float64 `json:"demand_percent" yaml:"demand_percent"` // null: its usage could not be read
}

func newSharesCommand() *cobra.Command {
	var o sharesOptions
	cmd := &cobra.Command{
		Use:   "shares",
		Short: "Print how the limits of global rules are shared between regions now",
		Long: `Print, for every global key any region was asked for in the last sync
window whose usage every replica has written (or the one --entity and
--resource name), each region's base, the
share of the limit it holds in the window under way by its own record, and
what it was asked for in the last window: all as percentages of the
limit's rate. It reads every region's store as a sync does (the same
flags), and writes nothing.`,
		Example: `  sluice shares --table sluice --region us-east-1 \
    --global-region us-east-1 --global-regions us-east-1=2,eu-west-1=1 \
    --global-store 'eu-west-1=dynamodb://sluice?region=eu-west-1'

  sluice shares ... --entity tenant-1 --resource api -o json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (o.entity == "") != (o.resource == "") {
				return usageError{errors.New("--entity and --resource go together: one global key")}
			}
			o.store.output = o.output
			s, release, err := o.open(cmd.Context())
			if err != nil {
				return err
			}
			defer release()
			var keys []regions.Key
			if o.entity != "" {
				keys = []regions.Key{{Entity: o.entity, Resource: o.resource}}
			}
			rows, unread := s.Survey(cmd.Context(), keys)
			for _, err := range unread {
				fmt.Fprintln(cmd.ErrOrStderr(), "sluice: could not read:", err)
			}
			pct := func(m map[regions.Region]int64, r regions.Region) *float64 {
				v, ok := m[r]
				if !ok {
					return nil
				}
				p := float64(v) * 100 / regions.Total
				return &p
			}
			var out []shareRow
			for _, k := range rows {
				for _, r := range s.Split.Regions() {
					out = append(out, shareRow{Entity: k.Key.Entity, Resource: k.Key.Resource, Region: string(r),
						Base: float64(s.Split.Base(r)) * 100 / regions.Total, Share: pct(k.Shares, r), Demand: pct(k.Demand, r)})
				}
			}
			if out == nil {
				out = []shareRow{}
			}
			err = o.store.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ENTITY\tRESOURCE\tREGION\tBASE\tSHARE\tDEMAND")
				show := func(p *float64) string {
					if p == nil {
						return "unread"
					}
					return fmt.Sprintf("%.1f%%", *p)
				}
				for _, r := range out {
					fmt.Fprintf(w, "%s\t%s\t%s\t%.1f%%\t%s\t%s\n", r.Entity, r.Resource, r.Region, r.Base, show(r.Share), show(r.Demand))
				}
			})
			if err == nil && len(unread) > 0 {
				err = fmt.Errorf("%d reads failed", len(unread))
			}
			return err
		},
	}
	f := cmd.Flags()
	o.addFlags(f)
	f.StringVar(&o.entity, "entity", "", "the entity of one global key to show (with --resource); empty: every key used in the last window")
	f.StringVar(&o.resource, "resource", "", "the resource of that key")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}
