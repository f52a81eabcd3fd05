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
	// First is when the lease first paid a call of those tokens (0: it
	// paid none), by this replica's clock (bucket.Report.First).
	First int64
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
	rep = h.takeReport(b.Res)
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
	rep = h.takeReport(b.Res)
	return slices.Clone(h.tokens), rep, true
}

// takeReport marks h's report carried by a write and returns it, lined
// up with res's limits by name (what was out under a limit res no longer
// has is not reported: its window frees it). h locked.
func (h *holding) takeReport(res Resolved) LeaseReport {
	h.reporting = true
	first := h.first
	// What it pays from now on is the next report's.
	h.first = 0
	if h.win == 0 {
		return LeaseReport{}
	}
	out := make([]int64, len(res.Limits))
	for j, l := range h.res.Limits {
		if i := slices.IndexFunc(res.Limits, func(o bucket.Limit) bool { return o.Name == l.Name }); i >= 0 && j < len(h.out) {
			out[i] = h.out[j]
		}
	}
	return LeaseReport{Window: h.win, Out: out, First: first}
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
		if rep.First != 0 && (h.first == 0 || rep.First < h.first) {
			h.first = rep.First
		}
		return
	}
	if rep.Window != 0 {
		h.expires = min(h.expires, rep.Window*ls.LeaseWindowMs())
	}
	h.win, h.out = 0, nil
}
