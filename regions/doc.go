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
// own table, and never changed once written but to extend it, or to end
// it where its borrower gave it back. Its borrower reads it from the
// lender's table and copies it into its own, where its replicas find it;
// a borrower that needs it no more gives it back there. Nothing else
// crosses regions, and a decision never does.
//
// # Why the sum holds
//
// In slot m, a region enforces its base, less what it lent for slot m,
// plus what it was lent for slot m and has read (Record.Share). Summed
// over the regions, every loan read by its borrower cancels against its
// lender's; a loan not read only leaves parts unused. So the shares of
// one slot sum to at most the bases' sum, Total. Three rules carry that
// from slots to the instants at which replicas decide:
//   - A replica enforces the smallest share of the slots from Skew before
//     its clock to Skew+Hold after it (InForce): a clock off by up to
//     Skew never enforces more than the share of the slot it truly is,
//     and tokens it takes now and spends up to Hold later (leases) fit
//     the share of the slot they are spent in too.
//   - A loan starts at least Lead slots after the slot its lender makes
//     it in, and is written by Clock.Deadline, a quarter into the slot
//     before it starts; a replica keeps a record it read for at most
//     CacheFor. So every copy of the lender's record its replicas hold
//     has the loan before tokens they take can be spent in its first
//     slot. A borrower gives a loan back by the same rule, and its lender
//     stops lending it only where it was given back.
//   - A loan is never shortened by its lender, so a borrower that read it
//     may use it to its end. A region's record is written on the
//     condition that it is still the one its plan read, so two syncs of
//     one region never write over each other's loans.
//
// A record that cannot be read by its region's replicas fails their
// decisions: it is never taken as absent, which would mean the base.
// Over any span of time T the regions together then admit at most what
// the whole limit's bucket would: its burst, plus its rate times T, plus
// a token per region for rounding.
//
// # Following demand
//
// Each window every region's sync reads every region's demand for the
// key (what it was asked in the last slot, in parts) and computes the
// same Targets from it: demand with headroom where it all fits, else the
// limit shared in proportion to demand. A region whose target is below
// its base lends the difference (Plan), split over the regions whose
// targets are above theirs in proportion to their deficits; a region
// holding loans its target does not need gives them back. A region lends
// only to regions whose demand it read, and each region decides only
// what it gives, so views that differ cost efficiency, never the bound.
// Loans are made to cover a few slots ahead and changed only when the
// right amount moves by more than a tenth, so a key whose demand holds
// still costs a write every few windows, and a key whose demand fits
// every region's base costs none.
package regions
