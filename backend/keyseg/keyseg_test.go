package keyseg

import (
	"strings"
	"testing"
)

// The bytes a layout reserves are escaped like '%' and '#'; a segment
// with nothing to escape is returned as it is, without allocating; a long
// one is hashed.
func TestEncode(t *testing.T) {
	for _, c := range []struct{ in, reserved, want string }{
		{"10.0.0.1", ":{}", "10.0.0.1"},
		{"a:b{c}", ":{}", "a%3Ab%7Bc%7D"},
		{"a:b{c}", "", "a:b{c}"},
		{"50%#", ":{}", "50%25%23"},
		{"caf\xe9", "", "caf%E9"},
		{"", ":{}", ""},
	} {
		if got := Encode(c.in, c.reserved); got != c.want {
			t.Errorf("Encode(%q, %q) = %q, want %q", c.in, c.reserved, got, c.want)
		}
	}
	long := strings.Repeat("{", MaxLen/3+1)
	if got := Encode(long, ":{}"); !strings.HasPrefix(got, HashMarker) || len(got) != len(HashMarker)+64 {
		t.Errorf("a segment escaping past %d bytes: %q, want it hashed", MaxLen, got)
	}
	if got := Encode(long, ""); got != long {
		t.Errorf("the same bytes unreserved were changed: %q", got)
	}
	key := "user-8f14e45fceea167a5a36dedd4bea2543"
	if n := testing.AllocsPerRun(100, func() { Encode(key, ":{}") }); n != 0 {
		t.Errorf("%v allocations for a segment with nothing to escape", n)
	}
}
