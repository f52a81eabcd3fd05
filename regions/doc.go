// Package regions splits a global limit into regional shares that move
// with demand and never sum to more than the limit, at any instant, on
// any replica, whatever fails. It is pure logic: no I/O and no clock. The
// sync that reads and writes the regions' tables, and the replicas that
// enforce a share, call it with what they read and the time they read.
//
// # The model
//
// A global limit is cut into Total parts. Each region has a base: the
// parts it holds on its own, fixed by configuration (Split). The bases
// sum to Total. A region with no record for a key, or whose record has
// run out, enforces its base: that is where every region starts, and
// where a region falls back to when its sync stops or it is cut off.
//
// Share moves as loans. A region whose demand is below its base lends
// parts of its base to regions whose demand is above theirs, for a run of
// sync windows (slots). A Loan is written by its lender, in the lender's
// own table, and never changed or withdrawn once written: the lender may
// only add loans, or extend the last one. Its borrower reads it from the
// lender's table and copies it into its own, where its replicas find it.
// Nothing else crosses regions, and a decision never does.
//
// # Why the sum holds
//
// In slot m, a lender enforces its base less, for each borrower, the
// largest amount it lent that borrower for slot m-1, m or m+1; a borrower
// enforces its base plus what it was lent for slot m and has read. A
// region's share (Record.Share) in slot m is therefore at most its base,
// less every loan it made that covers slot m, plus loans made to it that
// cover slot m; summed over the regions, the loans cancel and what is
// left is at most the sum of the bases, Total. A borrower that has not
// read a loan only enforces less. A record that cannot be read by its
// region's replicas fails their decisions: it is never taken as absent.
//
// The lender's reduction reaches one slot past each end of a loan so that
// what a replica still holds from the slot before (lease tokens, taken
// under the old share and spent after the change) never overlaps the
// other side's new share: over any span of one slot, the largest share
// each region enforced in it still sums to at most Total (see
// Record.Share). Leases must therefore be shorter than a slot.
//
// Three rules make that hold on real replicas:
//   - A replica near a slot's edge enforces the smaller of the two slots'
//     shares (InForce), so clocks that disagree by up to the stated skew
//     cannot have two regions on opposite sides of the same boundary.
//   - A loan starts at least Lead slots after the slot its lender wrote it
//     in, and a replica keeps a record it read for at most CacheFor, less
//     than a slot: by the time a lender's lower share is due, no replica
//     of the lender can still hold a copy from before it.
//   - A loan is never shortened, so a borrower that read it may use it to
//     its end, whatever the lender decides later.
//
// # Following demand
//
// Each window every region's sync reads every region's demand for the
// key (what it was asked in the last slot, in parts) and computes the
// same Targets from it: demand with headroom where it all fits, else the
// limit shared in proportion to demand. A region whose target is below
// its base lends the difference (Plan), split over the regions whose
// targets are above theirs in proportion to their deficits. Only lenders
// decide; a region whose view of the others is incomplete lends nothing
// new, and each region decides only what it gives, so views that differ
// cost efficiency, never the bound.
package regions
