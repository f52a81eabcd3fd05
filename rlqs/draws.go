package rlqs

import "math"

// draws is what one replica learns from its own decisions on a shared
// bucket about the other replicas drawing from it: each decision says
// what the bucket holds after it, and what it held at the replica's
// decision before, refilled since and less what the replica took
// meanwhile, is what it expected; the difference is what others took.
// Each replica counts only its own newcomers (Service.arrive), so that
// Envoys that start together spread over three replicas would each be
// sized as if their replica were alone, and ask three times what the
// bucket refills between them; the part of the draws that is the
// replica's own tells how many Envoys there are in all. Pure arithmetic
// on integers and the decisions' times.
type draws struct {
	level uint64 // whole tokens the bucket held after the last decision
	at    int64  // ms; 0: none yet
	// own and others are the tokens taken by this replica and by the
	// others, each decayed by drawsDecay since.
	own, others float64
}

// drawsDecay is how long (ms) it takes what draws counted to weigh
// half: Envoys that start together are sized over their first
// reporting interval, five seconds, renewed every half second.
const drawsDecay = 2000

// saw counts a decision of this replica at now that took took tokens and
// left the bucket of c holding level.
func (d draws) saw(level, took uint64, now int64, c capacity) draws {
	switch {
	case d.at == 0:
		return draws{level: level, at: now, own: float64(took)}
	case now < d.at:
		// Renewals of several streams run at once, each from the time
		// it began: a decision that began before the last one counted
		// still counts as this replica's draw, and says nothing newer
		// of the bucket.
		d.own += float64(took)
		return d
	}
	elapsed := float64(now - d.at)
	w := math.Exp2(-elapsed / drawsDecay)
	expected := math.Min(float64(d.level)+c.perSecond*elapsed/1000, float64(c.burst))
	others := math.Max(expected-float64(level)-float64(took), 0)
	return draws{level: level, at: now, own: d.own*w + float64(took), others: d.others*w + others}
}

// share is the part of the bucket's recent draws that was this
// replica's: one when others drew nothing, or too little is known (less
// than a tenth of the burst drawn), and never below a tenth.
func (d draws) share(c capacity) float64 {
	total := d.own + d.others
	if total < float64(c.burst)/10 || total <= 0 {
		return 1
	}
	return math.Max(d.own/total, 0.1)
}
