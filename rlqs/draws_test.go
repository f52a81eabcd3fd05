package rlqs

import (
	"math"
	"testing"
)

// A replica that alone draws from a bucket counts nothing as the others';
// one that sees the bucket drop by twice what it took counts two thirds
// as theirs; what was counted weighs half after drawsDecay.
func TestDrawsTellTheOtherReplicasPart(t *testing.T) {
	c := capacity{perSecond: 1000, burst: 1000}
	var alone draws
	alone = alone.saw(1000, 0, 1000, c) // a check: full
	for at := int64(1100); at <= 3000; at += 100 {
		// Takes 100 each 100 ms, which the refill pays back.
		alone = alone.saw(900, 100, at, c)
	}
	if alone.others != 0 || alone.share(c) != 1 {
		t.Errorf("alone: others %.1f, share %.2f, want 0 and 1", alone.others, alone.share(c))
	}
	var shared draws
	shared = shared.saw(1000, 0, 1000, c)
	level := uint64(1000)
	for at := int64(1100); at <= 3000; at += 100 {
		// The refill brings 100 a step; this replica takes 100 and the
		// others 200: the bucket drops by 200 a step until it is empty.
		level = uint64(max(int64(level)+100-300, 0))
		shared = shared.saw(level, 100, at, c)
		if level == 0 {
			break
		}
	}
	if s := shared.share(c); math.Abs(s-1.0/3) > 0.05 {
		t.Errorf("taking a third of the draws: share %.3f, want about 0.33", s)
	}
	// A decision that began before the latest counted one adds its take
	// and leaves the level as it was.
	before := shared
	late := shared.saw(700, 50, shared.at-10, c)
	if late.level != before.level || late.at != before.at || late.own != before.own+50 {
		t.Errorf("an older decision: %+v, want %+v with 50 more own", late, before)
	}
	// Half the weight after drawsDecay.
	decayed := shared.saw(shared.level+uint64(c.perSecond*drawsDecay/1000), 0, shared.at+drawsDecay, c)
	if math.Abs(decayed.own-shared.own/2) > 1 || math.Abs(decayed.others-shared.others/2) > 1 {
		t.Errorf("after %d ms: own %.1f others %.1f, want half of %.1f and %.1f", drawsDecay, decayed.own, decayed.others, shared.own, shared.others)
	}
}
