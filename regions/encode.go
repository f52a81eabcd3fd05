package regions

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Limits on a Record as stored: a store refuses, rather than keep, a
// record that passes them, and a reader refuses one it reads.
const (
	// MaxLoans is the most loans a record holds between it and any one
	// other region, given back or not: a lender makes at most a few a
	// window and a record keeps them for Horizon slots or so.
	MaxLoans = 64
	// MaxEncoded is the most bytes an encoded record takes.
	MaxEncoded = 32 << 10
	// maxRegionName is the longest region name a record names.
	maxRegionName = 64
)

// stored is a Record as Encode writes it: short keys, loans as arrays
// (made, from, to, parts, back), regions in name order.
type stored struct {
	V   int                  `json:"v"`
	Out map[Region][][]int64 `json:"o,omitempty"`
	In  map[Region][][]int64 `json:"i,omitempty"`
}

// storedVersion is the format Encode writes; Decode refuses others.
const storedVersion = 1

// Encode is rec as a store keeps it: compact JSON of a versioned format.
// It refuses a record Decode would refuse.
func Encode(rec Record) ([]byte, error) {
	if err := rec.check(); err != nil {
		return nil, err
	}
	s := stored{V: storedVersion, Out: packAll(rec.Out), In: packAll(rec.In)}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("regions: encoding a record: %w", err)
	}
	if len(b) > MaxEncoded {
		return nil, fmt.Errorf("regions: a record of %d bytes is over %d", len(b), MaxEncoded)
	}
	return b, nil
}

// Decode reads a record Encode wrote, and refuses anything else: another
// format, a region name that is empty or too long, more than MaxLoans
// loans with one region, a loan with no parts or more than Total, or one
// that ends before it starts. A record read is only as good as its
// checks: Plan checks a lender's loans against the lender's base too.
func Decode(b []byte) (Record, error) {
	if len(b) > MaxEncoded {
		return Record{}, fmt.Errorf("regions: a record of %d bytes is over %d", len(b), MaxEncoded)
	}
	var s stored
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		return Record{}, fmt.Errorf("regions: decoding a record: %w", err)
	}
	if d.More() {
		return Record{}, errors.New("regions: decoding a record: more after it")
	}
	if s.V != storedVersion {
		return Record{}, fmt.Errorf("regions: a record of format %d; this Sluice reads format %d", s.V, storedVersion)
	}
	out, err := unpackAll(s.Out)
	if err != nil {
		return Record{}, err
	}
	in, err := unpackAll(s.In)
	if err != nil {
		return Record{}, err
	}
	rec := Record{Out: out, In: in}
	if err := rec.check(); err != nil {
		return Record{}, err
	}
	return rec, nil
}

var errBadLoan = errors.New("not a loan any Plan makes")

// ErrShareChanged is what a store's conditional write of a share record
// wraps when the stored record is no longer at the version the write was
// planned from: another sync of the region wrote in between.
var ErrShareChanged = errors.New("the share record changed since it was read")

// check reports what makes rec one no store should keep.
func (rec Record) check() error {
	for side, m := range map[string]map[Region]Loans{"lent to": rec.Out, "lent by": rec.In} {
		for r, ls := range m {
			if r == "" || len(r) > maxRegionName {
				return fmt.Errorf("regions: a record with loans %s a region named %q: %w", side, r, errBadLoan)
			}
			if len(ls) > MaxLoans {
				return fmt.Errorf("regions: %d loans %s %q, over %d", len(ls), side, r, MaxLoans)
			}
			for _, l := range ls {
				if l.Parts <= 0 || l.Parts > Total || l.To < l.From || (l.Back != 0 && l.Back < l.From) {
					return fmt.Errorf("regions: a loan of %d parts %s %q for slots %d to %d (back from %d): %w", l.Parts, side, r, l.From, l.To, l.Back, errBadLoan)
				}
			}
		}
	}
	return nil
}

func packAll(m map[Region]Loans) map[Region][][]int64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[Region][][]int64, len(m))
	for _, r := range slices.Sorted(maps.Keys(m)) {
		for _, l := range m[r] {
			out[r] = append(out[r], []int64{int64(l.Made), int64(l.From), int64(l.To), l.Parts, int64(l.Back)})
		}
	}
	return out
}

func unpackAll(m map[Region][][]int64) (map[Region]Loans, error) {
	out := make(map[Region]Loans, len(m))
	for r, ls := range m {
		if len(ls) > MaxLoans {
			return nil, fmt.Errorf("regions: %d loans with %q, over %d", len(ls), r, MaxLoans)
		}
		for _, x := range ls {
			if len(x) != 5 {
				return nil, fmt.Errorf("regions: decoding a record: a loan of %d numbers, not 5", len(x))
			}
			out[r] = append(out[r], Loan{Made: Slot(x[0]), From: Slot(x[1]), To: Slot(x[2]), Parts: x[3], Back: Slot(x[4])})
		}
	}
	return out, nil
}

// Stored is one share record as a store read it in a batch: the record
// and the version it is at (0, with the zero Record, when none is
// stored), or the error that kept it from being read, such as a record
// that does not decode: that key's alone, never "none".
type Stored struct {
	Record  Record
	Version int64
	Err     error
}
