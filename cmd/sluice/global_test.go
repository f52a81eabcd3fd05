package main

import (
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/regions"
)

func TestParseGlobal(t *testing.T) {
	for _, c := range []struct {
		region, weights string
		want            int64 // parts; 0: an error
	}{
		{"", "", regions.Total},
		{"eu-west-1", "us-east-1=3,eu-west-1=1", regions.Total / 4},
		{"eu-west-1", " us-east-1 = 3 , eu-west-1", regions.Total / 4}, // a bare name weighs 1
		{"ap", "us=1,eu=1,ap=1", regions.Total/3 + 1},                  // the rounding's part goes to the first name
		{"eu-west-1", "", 0},
		{"", "us-east-1=1", 0},
		{"mars", "us-east-1=1,eu-west-1=1", 0},
		{"us", "us=0,eu=1", 0},
		{"us", "us=-1", 0},
		{"us", "us=x", 0},
		{"us", "us=1,us=2", 0},
		{"us", "us=1,,eu=1", 0},
	} {
		g, err := parseGlobal(c.region, strings.ReplaceAll(c.weights, " ", ""))
		switch {
		case c.want == 0 && err == nil:
			t.Errorf("%q %q: took it (%d parts)", c.region, c.weights, g.Parts())
		case c.want != 0 && err != nil:
			t.Errorf("%q %q: %v", c.region, c.weights, err)
		case c.want != 0 && g.Parts() != c.want:
			t.Errorf("%q %q: %d parts, want %d", c.region, c.weights, g.Parts(), c.want)
		}
	}
}
