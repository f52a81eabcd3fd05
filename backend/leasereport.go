package backend

import (
	"slices"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// A store that counts the tokens out on lease (bucket.State.Out) learns
// what a replica spent from its lease only from the replica: each write
// that renews, folds or returns a lease carries a report of it, what the
// store counts out for this replica's lease and in which expiry window
// (bucket.Return), and takes the next lease into the window of its new
// expiry (bucket.Lend). One write at a time carries a lease's report: a
// second one, while the first is on its way, neither reports nor folds
// the lease's tokens, which the first write's report still covers.

// LeaseReport is what a write tells its store of this replica's lease on
// a bucket.
type LeaseReport struct {
	// Window is the expiry window the lease's tokens are out in; 0 when
	// the store counts nothing out for it.
	Window int64
	// Out is, per limit of the bucket, what the store counts out for the
	// lease: every token of its grants since its last report, spent or
	// not. nil with Window 0.
	Out []int64
	// Base, when not nil, is the bucket as the lease's last report left
	// it, with nobody else seen writing it since: Held is what the lease
	// held then and Spends, per limit, what it paid since, so that a
	// write that finds the bucket still exactly as Base may replay them
	// (bucket.Replay) and lose none of the refill their room stopped.
	Base   BucketView
	Held   []int64
	Spends [][]bucket.Spend
}

// LeaseWindowMs is the width (ms) of the expiry windows of these leases.
func (ls *Leases[K]) LeaseWindowMs() int64 {
	return bucket.LeaseWindowMs(ls.Horizon())
}

// NextWindow is the window a grant made at now expires in: a lease lasts
// two horizons from its grant.
func (ls *Leases[K]) NextWindow(now int64) int64 {
	return bucket.LeaseWindow(now+2*ls.Horizon(), ls.LeaseWindowMs())
}

// Fold takes out of b's lease, for a write that decides on the bucket
// and the lease together, every token it holds (per b's limits) and its
// report. ok is false, and nothing is taken, while another write carries
// the report: the lease keeps paying from memory meanwhile.
func (ls *Leases[K]) Fold(b *LeaseBucket[K]) (tokens []int64, rep LeaseReport, ok bool) {
	h := ls.lockLive(b.Key)
	defer h.mu.Unlock()
	if h.reporting {
		return nil, LeaseReport{}, false
	}
	rep = ls.takeReport(h, b.Res, b.FP)
	tokens = ls.take(h, b.Res)
	return tokens, rep, true
}

// Renewing takes b's report for a renewal, which keeps what the lease
// holds out in the new window: keep is what it holds now, per limit.
// ok is false while another write carries the report.
func (ls *Leases[K]) Renewing(b *LeaseBucket[K]) (keep []int64, rep LeaseReport, ok bool) {
	h := ls.hold(b)
	if h == nil {
		return nil, LeaseReport{}, false
	}
	defer h.mu.Unlock()
	if h.reporting {
		return nil, LeaseReport{}, false
	}
	rep = ls.takeReport(h, b.Res, b.FP)
	return slices.Clone(h.tokens), rep, true
}

// takeReport marks h's report carried by a write and returns it, lined
// up with res's limits by name (what was out under a limit res no longer
// has is not reported: its window frees it). h locked.
func (ls *Leases[K]) takeReport(h *holding, res Resolved, fp string) LeaseReport {
	h.reporting = true
	h.spendsMark = len(h.spends)
	if h.win == 0 {
		return LeaseReport{}
	}
	out := make([]int64, len(res.Limits))
	for j, l := range h.res.Limits {
		if i := slices.IndexFunc(res.Limits, func(o bucket.Limit) bool { return o.Name == l.Name }); i >= 0 && j < len(h.out) {
			out[i] = h.out[j]
		}
	}
	rep := LeaseReport{Window: h.win, Out: out}
	if h.replayable(res, fp) {
		rep.Base, rep.Held = h.spendsView, slices.Clone(h.spendsHeld)
		rep.Spends = make([][]bucket.Spend, len(res.Limits))
		for j := range res.Limits {
			rep.Spends[j] = h.spendsOf(j)
		}
	}
	return rep
}

// maxSpends bounds the spends a lease remembers between reports: past
// it, the oldest two are one, at the later moment (which only makes a
// replay credit less refill).
const maxSpends = 128

// noteSpend records that h paid costs (per limit) at now. h locked.
func (h *holding) noteSpend(now int64, costs []int64) {
	if h.spendsView == nil {
		return
	}
	if len(h.spends) >= maxSpends {
		a, b := h.spends[0], h.spends[1]
		for j := range b.tokens {
			b.tokens[j] += a.tokens[j]
		}
		h.spends = h.spends[1:]
		h.spendsMark = max(h.spendsMark-1, 0)
	}
	h.spends = append(h.spends, spendAt{at: now, tokens: costs})
}

// spendsOf lists what h paid of limit j since its last report.
func (h *holding) spendsOf(j int) []bucket.Spend {
	out := make([]bucket.Spend, 0, len(h.spends))
	for _, s := range h.spends {
		if j < len(s.tokens) {
			out = append(out, bucket.Spend{At: s.at, Tokens: s.tokens[j]})
		}
	}
	return out
}

// replayable reports whether h's spends since its last report can be
// replayed on the bucket it left (under res's limits, of fingerprint fp;
// the view it recorded then still its last; no other writer seen since).
// h locked.
func (h *holding) replayable(res Resolved, fp string) bool {
	return h.spendsView != nil && h.view == h.spendsView && h.win != 0 && h.othersAt == 0 &&
		len(h.spendsHeld) == len(res.Limits) && h.matches(res, fp) && h.spendsView.Config() == fp
}

// spendAt is what a lease paid of each limit at a moment (ms).
type spendAt struct {
	at     int64
	tokens []int64
}

// Reported settles the report a write carried on b's lease, once the
// write has landed: the store now counts out, per limit, what the lease
// kept (kept, what of keep the store still covered: nothing when the
// lease's window had been freed) and what the write granted, all in
// window win. The lease gives up what it held beyond kept.
func (ls *Leases[K]) Reported(b *LeaseBucket[K], kept, grant []int64, win, now int64) {
	h := ls.hold(b)
	if h == nil {
		return
	}
	defer h.mu.Unlock()
	h.reporting = false
	// What was paid before the report is in it; what was paid since is
	// replayed from the bucket this write leaves, as if paid once it
	// landed.
	h.spends = h.spends[min(h.spendsMark, len(h.spends)):]
	for i := range h.spends {
		h.spends[i].at = max(h.spends[i].at, now)
	}
	h.rebase = true
	if len(h.out) != len(b.Res.Limits) {
		h.out = make([]int64, len(b.Res.Limits))
	}
	var sum, lost int64
	for j := range b.Res.Limits {
		var k, g int64
		if j < len(kept) {
			k = kept[j]
		}
		if j < len(grant) {
			g = grant[j]
		}
		if h.tokens[j] > k {
			lost += h.tokens[j] - k
			h.tokens[j] = k
		}
		h.out[j] = k + g
		sum += k + g
	}
	if lost > 0 {
		ls.stats.LeaseOutstanding.Add(-lost)
		ls.stats.LeaseDropped.Add(uint64(lost))
	}
	h.win = 0
	if sum > 0 {
		h.win = win
		// Never spent past its window's end: the store frees the window
		// a margin after it, for any writer's clock.
		h.expires = min(h.expires, win*ls.LeaseWindowMs())
	}
}

// Unreported settles the report of a write that did not land on b's
// lease. sure: it certainly did not (the store still counts what rep
// says), and the report is the lease's again; otherwise the store may
// have taken it, and the lease reports nothing more: what it held stays
// out in the store until its window is freed, and the tokens it still
// holds are spent only until then.
func (ls *Leases[K]) Unreported(b *LeaseBucket[K], rep LeaseReport, sure bool) {
	h := ls.get(b.Key)
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reporting = false
	if sure && h.matches(b.Res, b.FP) {
		h.win, h.out = rep.Window, rep.Out
		return
	}
	h.spends, h.spendsView = nil, nil
	if rep.Window != 0 {
		h.expires = min(h.expires, rep.Window*ls.LeaseWindowMs())
	}
	h.win, h.out = 0, nil
}

// Contended records that a write of this replica on k's bucket lost its
// race at now: another writer has written it, and the lease's spending
// is no longer replayed on it (replayable).
func (ls *Leases[K]) Contended(k K, now int64) {
	if h := ls.get(k); h != nil {
		h.mu.Lock()
		h.othersAt = max(h.othersAt, now)
		h.mu.Unlock()
	}
}
