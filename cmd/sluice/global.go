package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/regions"
)

// globalOptions are the flags that say how the rules marked global are
// shared between regions: this process's region, every region's weight,
// and the clock the regions' replicas and syncs agree on. serve, sync
// and shares take the same ones, with the same defaults: they must agree
// in every region.
type globalOptions struct {
	region, regions    string
	window, skew, hold time.Duration
}

// Defaults of the regions' clock (docs/regions.md says why).
const (
	defaultGlobalWindow = 10 * time.Second
	defaultGlobalSkew   = time.Second
	defaultGlobalHold   = time.Second
)

func (o *globalOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.region, "global-region", "", "this process's region among --global-regions: a replica enforces that region's part of every rule marked global")
	f.StringVar(&o.regions, "global-regions", "", "the regions that share the rules marked global, each with its weight (us-east-1=2,eu-west-1=1; a region's base is its weight over their sum); the same in every region; empty: global rules are enforced whole")
	f.DurationVar(&o.window, "global-window", defaultGlobalWindow, "the sync window: how often each region's sync moves shares of the global rules toward demand; 0 fixes each region at its base; the same in every region")
	f.DurationVar(&o.skew, "global-skew", defaultGlobalSkew, "the most any two clocks of the regions' replicas and syncs may differ by; the same in every region")
	f.DurationVar(&o.hold, "global-hold", defaultGlobalHold, "the longest a decision may take from reading its region's share to spending tokens under it; the same in every region")
}

// clock is the regions' clock the flags give; the zero Clock when the
// window is 0 (shares fixed at the bases).
func (o *globalOptions) clock() (regions.Clock, error) {
	if o.window == 0 {
		return regions.Clock{}, nil
	}
	for name, d := range map[string]time.Duration{"--global-window": o.window, "--global-skew": o.skew, "--global-hold": o.hold} {
		if d < 0 || d%time.Millisecond != 0 {
			return regions.Clock{}, usageError{fmt.Errorf("%s %v: want a whole number of milliseconds, 0 or more", name, d)}
		}
	}
	c := regions.Clock{Window: o.window.Milliseconds(), Skew: o.skew.Milliseconds(), Hold: o.hold.Milliseconds()}
	if err := c.Validate(); err != nil {
		return regions.Clock{}, usageError{fmt.Errorf("--global-window %v, --global-skew %v, --global-hold %v: %w", o.window, o.skew, o.hold, err)}
	}
	return c, nil
}

// global is the backend.Global of a replica: its region's base, or, when
// moves is set and the window is not 0, the share its region's records
// give it.
func (o *globalOptions) global(moves bool) (backend.Global, error) {
	g, err := parseGlobal(o.region, o.regions)
	if err != nil || !moves || o.region == "" {
		return g, err
	}
	c, err := o.clock()
	if err != nil || c.Window == 0 {
		return g, err
	}
	return g.Moving(c)
}

// parseGlobal builds the backend.Global of --global-region and
// --global-regions ("us-east-1=2,eu-west-1=1"): both, or neither for the
// zero Global (global rules enforced whole).
func parseGlobal(region, weights string) (backend.Global, error) {
	if region == "" && weights == "" {
		return backend.Global{}, nil
	}
	if region == "" || weights == "" {
		return backend.Global{}, usageError{errors.New("--global-region and --global-regions go together: this process's region, and every region's weight")}
	}
	split, err := parseSplit(weights)
	if err != nil {
		return backend.Global{}, err
	}
	g, err := backend.NewGlobal(split, regions.Region(region))
	if err != nil {
		return backend.Global{}, usageError{fmt.Errorf("--global-region: %w", err)}
	}
	return g, nil
}

// parseSplit reads --global-regions.
func parseSplit(weights string) (regions.Split, error) {
	w := map[regions.Region]int64{}
	for _, part := range strings.Split(weights, ",") {
		name, weight, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			name, weight = strings.TrimSpace(part), "1"
		}
		n, err := strconv.ParseInt(weight, 10, 64)
		if name == "" || err != nil || n <= 0 {
			return regions.Split{}, usageError{fmt.Errorf("--global-regions %q: want NAME=WEIGHT pairs with positive whole weights, comma-separated (us-east-1=2,eu-west-1=1)", weights)}
		}
		if _, dup := w[regions.Region(name)]; dup {
			return regions.Split{}, usageError{fmt.Errorf("--global-regions %q: region %q is named twice", weights, name)}
		}
		w[regions.Region(name)] = n
	}
	split, err := regions.NewSplit(w)
	if err != nil {
		return regions.Split{}, usageError{fmt.Errorf("--global-regions: %w", err)}
	}
	return split, nil
}
