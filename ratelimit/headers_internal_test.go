package ratelimit

import "testing"

// Limit names are any string; the IETF fields carry them as structured
// field strings, which hold printable ASCII only.
func TestSFString(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"rpm", `"rpm"`, true},
		{"v1.chat tokens", `"v1.chat tokens"`, true},
		{`a"b\c`, `"a\"b\\c"`, true},
		{"", `""`, true},
		{"tökens", "", false},
		{"tab\there", "", false},
	} {
		got, ok := sfString(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("sfString(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
