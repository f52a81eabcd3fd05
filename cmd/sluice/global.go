package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/regions"
)

// parseGlobal builds the backend.Global of --global-region and
// --global-regions ("us-east-1=2,eu-west-1=1"): both, or neither for the
// zero Global (global rules enforced whole).
func parseGlobal(region, weights string) (backend.Global, error) {
	if region == "" && weights == "" {
		return backend.Global{}, nil
	}
	if region == "" || weights == "" {
		return backend.Global{}, usageError{errors.New("--global-region and --global-regions go together: this replica's region, and every region's weight")}
	}
	w := map[regions.Region]int64{}
	for _, part := range strings.Split(weights, ",") {
		name, weight, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			name, weight = strings.TrimSpace(part), "1"
		}
		n, err := strconv.ParseInt(weight, 10, 64)
		if name == "" || err != nil || n <= 0 {
			return backend.Global{}, usageError{fmt.Errorf("--global-regions %q: want NAME=WEIGHT pairs with positive whole weights, comma-separated (us-east-1=2,eu-west-1=1)", weights)}
		}
		if _, dup := w[regions.Region(name)]; dup {
			return backend.Global{}, usageError{fmt.Errorf("--global-regions %q: region %q is named twice", weights, name)}
		}
		w[regions.Region(name)] = n
	}
	split, err := regions.NewSplit(w)
	if err != nil {
		return backend.Global{}, usageError{fmt.Errorf("--global-regions: %w", err)}
	}
	g, err := backend.NewGlobal(split, regions.Region(region))
	if err != nil {
		return backend.Global{}, usageError{fmt.Errorf("--global-region: %w", err)}
	}
	return g, nil
}
