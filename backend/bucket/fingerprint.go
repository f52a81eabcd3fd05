package bucket

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
)

// Fingerprint identifies a set of limits independently of their order. A
// stored bucket keeps the fingerprint of the limits it was built from, so a
// changed config is noticed on the bucket's next write (the cfg attribute).
func Fingerprint(limits []Limit) string {
	byName := func(a, b Limit) int { return strings.Compare(a.Name, b.Name) }
	sorted := limits
	if !slices.IsSortedFunc(limits, byName) {
		// Most sets come sorted (and a set of one always does), so the
		// copy is rare: a fingerprint is taken on every decision.
		sorted = slices.Clone(limits)
		slices.SortFunc(sorted, byName)
	}
	h := fnv.New64a()
	var buf [8]byte
	for _, l := range sorted {
		binary.BigEndian.PutUint64(buf[:], uint64(len(l.Name)))
		h.Write(buf[:])
		h.Write([]byte(l.Name))
		for _, v := range []int64{l.Amount, l.Period, l.Burst} {
			binary.BigEndian.PutUint64(buf[:], uint64(v))
			h.Write(buf[:])
		}
		if l.PerRequest {
			h.Write([]byte{1})
		} else {
			h.Write([]byte{0})
		}
		if l.Debt != 0 {
			// Only a debt other than the default enters the hash, so
			// that buckets written before limits had one keep their
			// fingerprint.
			binary.BigEndian.PutUint64(buf[:], uint64(max(l.Debt, NoDebt)))
			h.Write([]byte{'d'})
			h.Write(buf[:])
		}
		if l.IsBudget() {
			// Only a budget's calendar enters it, for the same reason: a
			// rate turned budget (or moved to another zone) has other
			// limits, and its bucket is reconciled.
			h.Write([]byte{'c'})
			h.Write([]byte(l.CalendarKey()))
			h.Write([]byte{0})
		}
	}
	return strconv.FormatUint(h.Sum64(), 36)
}
