package descriptors

import "strings"

// pattern is a wildcard value split at its '*'s: "foo*bar*baz" is
// {"foo", "bar", "baz"}, "*" is {"", ""}. It always has at least two parts.
// Each '*' matches any run of characters, including none.
type pattern []string

func compilePattern(value string) pattern { return strings.Split(value, "*") }

// match reports whether s matches p. It never allocates: the first part must
// be a prefix, the last a suffix that does not overlap it, and the parts in
// between must appear in order; taking the leftmost occurrence of each is
// always safe because a '*' can absorb whatever is skipped.
func (p pattern) match(s string) bool {
	first, last := p[0], p[len(p)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, mid := range p[1 : len(p)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return true
}
