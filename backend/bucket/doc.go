// Package bucket is the token-bucket arithmetic of Sluice: pure functions
// over integers, with no I/O, no clock and no locks, so that every backend
// decides exactly alike and the rules can be tested exhaustively.
//
// There are only a few types. A Limit is one rule of a bucket (so many
// tokens per period, up to a burst). A State is what a store keeps for one
// limit: the tokens held and the clock up to which refill was credited. A
// Result is what one decision found for one limit.
//
// Units: tokens are counted in millitokens (Milli to a token) and time in
// milliseconds since the epoch. The caller supplies now; nothing here reads
// the wall clock.
//
// Refill is exact. Each limit has its own clock, and refill advances it in
// whole steps of gcd-reduced (time, tokens) pairs, so the clock moves by
// exactly the time the credited tokens stand for: no fraction of a token is
// ever lost or credited twice, however often a bucket is refilled, and a
// slow limit beside a fast one is never starved. A bucket that reaches its
// burst is full and its clock moves to now, so time spent full is never
// credited later.
//
// A decision over a bucket is all or nothing: allowed only if every limit
// has the tokens it costs, and then it consumes from all of them. Amounts
// are bounded (MaxTokens, MaxPeriod) and hits are clamped before any
// multiplication, so no input overflows int64.
package bucket
