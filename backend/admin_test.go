package backend

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
)

func TestBucketViolations(t *testing.T) {
	const now = 1_700_000_000_000
	good := func() Bucket {
		return Bucket{Entity: "e", Resource: "r", Cfg: "f",
			Limits: []bucket.Limit{{Name: "a", Amount: 1000, Period: 1000, Burst: 5000}},
			States: []bucket.State{{Tokens: 5000, Clock: now, Consumed: 7000}}}
	}
	for _, c := range []struct {
		name   string
		break_ func(*Bucket)
		want   string // "" = no violation
	}{
		{"as written", func(*Bucket) {}, ""},
		{"empty", func(b *Bucket) { b.States[0].Tokens = 0 }, ""},
		{"clock within the skew", func(b *Bucket) { b.States[0].Clock = now + 900 }, ""},
		{"over the burst", func(b *Bucket) { b.States[0].Tokens = 5001 }, "outside [floor -5000, burst 5000]"},
		{"in debt, down to one burst", func(b *Bucket) { b.States[0].Tokens = -5000 }, ""},
		{"below the floor", func(b *Bucket) { b.States[0].Tokens = -5001 }, "outside [floor -5000, burst"},
		{"in debt without debt allowed", func(b *Bucket) { b.Limits[0].Debt, b.States[0].Tokens = bucket.NoDebt, -1 }, "outside [floor 0, burst"},
		{"clock in the future", func(b *Bucket) { b.States[0].Clock = now + 1001 }, "in the future"},
		{"no clock", func(b *Bucket) { b.States[0].Clock = 0 }, "refill clock 0"},
		{"negative consumed", func(b *Bucket) { b.States[0].Consumed = -1 }, "consumed total"},
		{"zero period", func(b *Bucket) { b.Limits[0].Period = 0 }, "rate 1000 per 0 ms"},
		{"no fingerprint", func(b *Bucket) { b.Cfg = "" }, "no cfg"},
		{"no limits", func(b *Bucket) { b.Limits, b.States = nil, nil }, "no limits"},
		{"no entity", func(b *Bucket) { b.Entity = "" }, "entity or resource"},
	} {
		b := good()
		c.break_(&b)
		got := strings.Join(b.Violations(now, time.Second), "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: violations %q, want %q", c.name, got, c.want)
		}
	}
}
