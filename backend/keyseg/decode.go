package keyseg

import "strings"

// Decode is the inverse of Encode with the same reserved bytes: it undoes
// the %XX escapes of a segment Encode kept readable. A hashed segment
// cannot be undone, and text Encode would not have produced (a stray '%',
// lower-case hex, an escape of a byte it keeps) is not an encoding of
// anything; for both Decode returns seg unchanged and false, so a store
// can still show the name by its encoding. Tools that list keys use it to
// name what they found; nothing on a decision's path needs it.
func Decode(seg, reserved string) (string, bool) {
	if strings.HasPrefix(seg, HashMarker) {
		return seg, false
	}
	if strings.IndexByte(seg, '%') < 0 {
		// Encode keeps such a segment as it is, unless it holds a byte
		// it would have escaped.
		return seg, Encode(seg, reserved) == seg
	}
	var b strings.Builder
	b.Grow(len(seg))
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(seg) {
			return seg, false
		}
		hi, lo := strings.IndexByte(upperHex, seg[i+1]), strings.IndexByte(upperHex, seg[i+2])
		if hi < 0 || lo < 0 {
			return seg, false
		}
		b.WriteByte(byte(hi<<4 | lo))
		i += 2
	}
	s := b.String()
	if Encode(s, reserved) != seg {
		return seg, false
	}
	return s, true
}
