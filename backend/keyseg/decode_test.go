package keyseg

import (
	"strings"
	"testing"
)

// Decode gives back what Encode was given, for every segment Encode keeps
// readable; a hashed segment, and text Encode never writes, come back
// unchanged and not ok.
func TestDecode(t *testing.T) {
	for _, s := range []string{"", "10.0.0.1", "a:b{c}", "50%#", "caf\xe9", "ünï", "%", "%3A", "#H", strings.Repeat("x", MaxLen)} {
		enc := Encode(s, ":{}")
		got, ok := Decode(enc, ":{}")
		if !ok || got != s {
			t.Errorf("Decode(Encode(%q)) = %q, %v", s, got, ok)
		}
	}
	long := strings.Repeat("{", MaxLen/3+1)
	for _, seg := range []string{Encode(long, ":{}"), "a%", "a%3", "a%3a", "a%41", "a:b", "a#b", "caf\xe9"} {
		if got, ok := Decode(seg, ":{}"); ok || got != seg {
			t.Errorf("Decode(%q) = %q, %v; want it unchanged and not ok", seg, got, ok)
		}
	}
}
