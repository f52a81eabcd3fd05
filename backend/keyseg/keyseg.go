// Package keyseg turns request data (entities, resources) into segments
// of the keys a backend stores buckets and records under: injective, free
// of the bytes the key layout reserves, valid UTF-8, and bounded in
// length, while the common case stays readable in the store.
package keyseg

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

const (
	// MaxLen is the longest escaped segment kept readable; longer ones
	// are hashed. Real entities (addresses, host names, header values)
	// are far shorter.
	MaxLen = 512

	// HashMarker starts a hashed segment. An escaped segment never
	// contains a raw '#', so no escaped form can equal a hashed one.
	HashMarker = "#H"

	upperHex = "0123456789ABCDEF"
)

// Encode returns s as a key segment:
//
//   - '%', '#', every byte of reserved (ASCII bytes a layout uses as
//     separators) and every byte that is not part of valid UTF-8 become
//     %XX. Everything else is kept. Since every '%' of the output starts
//     an escape, decoding is unambiguous.
//   - If the escaped form is longer than MaxLen bytes, the segment is
//     HashMarker followed by the lowercase hex SHA-256 of the original
//     bytes. Escaped forms never contain '#', so the two forms cannot
//     meet, and two hashed forms only meet on a SHA-256 collision. The
//     original must then be kept beside the key.
//
// The empty string encodes to "".
func Encode(s, reserved string) string {
	n, plain := escapedLen(s, reserved)
	if n > MaxLen {
		sum := sha256.Sum256([]byte(s))
		return HashMarker + hex.EncodeToString(sum[:])
	}
	if plain {
		return s
	}
	var b strings.Builder
	b.Grow(n)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if escaped(c, reserved) {
				escapeByte(&b, c)
			} else {
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			escapeByte(&b, c)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func escaped(c byte, reserved string) bool {
	return c == '%' || c == '#' || strings.IndexByte(reserved, c) >= 0
}

// escapedLen is the length of the escaped form of s (before hashing), and
// whether s needs no escaping at all. It stops counting once the bound is
// passed, so hashing a huge input does not scan it twice.
func escapedLen(s, reserved string) (n int, plain bool) {
	plain = true
	for i := 0; i < len(s) && n <= MaxLen; {
		c := s[i]
		if c < utf8.RuneSelf {
			if escaped(c, reserved) {
				n += 3
				plain = false
			} else {
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			n += 3
			plain = false
		} else {
			n += size
		}
		i += size
	}
	return n, plain
}

func escapeByte(b *strings.Builder, c byte) {
	b.WriteByte('%')
	b.WriteByte(upperHex[c>>4])
	b.WriteByte(upperHex[c&0x0f])
}
