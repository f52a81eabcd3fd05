package dynamodb

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Decode, Hashed and Prefix read keys back; only the tests need to, to
// check that every key is unambiguous.

// hashedLen is the length of a hashed segment: the marker followed by
// the lowercase hex of a SHA-256 digest.
const hashedLen = len(hashMarker) + 2*sha256.Size

// Prefix returns the deployment prefix, "" when keys are unprefixed.
func (k Keys) Prefix() string { return k.prefix }

// Decode inverts Encode for a segment that is not hashed. It reports false
// for a hashed segment (the original is not recoverable from the key and
// must be read from the item's attribute) and for anything Encode could not
// have produced (a raw '#', a malformed or needless escape, invalid UTF-8,
// an over-long segment), so a key read back from the table is either
// decoded exactly or rejected.
func Decode(seg string) (string, bool) {
	if Hashed(seg) || strings.IndexByte(seg, '#') >= 0 {
		return "", false
	}
	if strings.IndexByte(seg, '%') < 0 {
		if !utf8.ValidString(seg) || len(seg) > maxSegmentLen {
			return "", false
		}
		return seg, true
	}
	b := make([]byte, 0, len(seg))
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(seg) {
			return "", false
		}
		hi, ok1 := unhex(seg[i+1])
		lo, ok2 := unhex(seg[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	s := string(b)
	// Accept only the canonical form, so Decode is a true inverse: "%41"
	// or a lowercase "%2f" would decode but is never produced by Encode.
	if Encode(s) != seg {
		return "", false
	}
	return s, true
}

// unhex reads one uppercase hex digit, the only case Encode writes.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Hashed reports whether seg is a hashed segment ("#H" and 64 lowercase hex
// digits), whose original must be read from the item rather than the key.
func Hashed(seg string) bool {
	if len(seg) != hashedLen || !strings.HasPrefix(seg, hashMarker) {
		return false
	}
	for i := len(hashMarker); i < len(seg); i++ {
		c := seg[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// DynamoDB's key size limits, in UTF-8 bytes; GSI keys have the same ones.
const (
	dynamoMaxPK = 2048
	dynamoMaxSK = 1024
)

// longestPrefix is a valid prefix of the maximum length, the worst case for
// key sizes.
var longestPrefix = strings.Repeat("p", maxPrefixLen-4) + "_.:-"

// allMarkers are the fixed parts of every key kind; an encoded segment must
// never contain one.
var allMarkers = []string{
	entityMarker, resourceMarker, systemMarker, parentMarker,
	bucketSKMarker, configSKMarker, metaSK, resourceConfig,
	childMarker, bucketMarker,
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "#H" + hex.EncodeToString(sum[:])
}

// refEscape is an independent reference for the escaped (unhashed) form:
// it relies on range-over-string yielding RuneError with width 1 for each
// invalid byte, where Encode decodes runes by hand.
func refEscape(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == '%' || r == '#':
			b.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{s[i]})))
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			b.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{s[i]})))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func mustKeys(t testing.TB, prefix string) Keys {
	t.Helper()
	k, err := NewKeys(prefix)
	if err != nil {
		t.Fatalf("NewKeys(%q): %v", prefix, err)
	}
	return k
}

func TestKeysEncode(t *testing.T) {
	long512 := strings.Repeat("a", maxSegmentLen)
	long513 := strings.Repeat("a", maxSegmentLen+1)
	hashes170 := strings.Repeat("#", 170) // escapes to 510 bytes
	hashes171 := strings.Repeat("#", 171) // escapes to 513 bytes
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"plain", "user-42", "user-42"},
		{"ip", "203.0.113.7", "203.0.113.7"},
		{"ipv6", "2001:db8::1", "2001:db8::1"},
		{"default", "_default_", "_default_"},
		{"path and spaces", "/api/v1 x?y=z&w", "/api/v1 x?y=z&w"},
		{"hash", "a#b", "a%23b"},
		{"only hash", "#", "%23"},
		{"percent", "100%", "100%25"},
		{"literal escape", "%23", "%2523"},
		{"marker forgery", "x#BUCKET#y", "x%23BUCKET%23y"},
		{"hashed forgery", "#H00", "%23H00"},
		{"multibyte kept", "café€𝄞", "café€𝄞"},
		{"valid U+FFFD kept", "\uFFFD", "\uFFFD"},
		{"invalid byte", "a\xffb", "a%FFb"},
		{"lone continuation", "\x80", "%80"},
		{"truncated rune", "\xe2\x82", "%E2%82"},
		{"surrogate", "\xed\xa0\x80", "%ED%A0%80"},
		{"nul and controls kept", "a\x00\n\t", "a\x00\n\t"},
		{"at bound", long512, long512},
		{"over bound", long513, hashOf(long513)},
		{"escaped at bound-2", hashes170, strings.Repeat("%23", 170)},
		{"escaped over bound", hashes171, hashOf(hashes171)},
		{"escape crosses bound", strings.Repeat("a", 510) + "#", hashOf(strings.Repeat("a", 510) + "#")},
		{"huge", strings.Repeat("x", 1<<20), hashOf(strings.Repeat("x", 1<<20))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Encode(tc.in)
			if got != tc.want {
				t.Fatalf("Encode(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if h := Hashed(got); h != strings.HasPrefix(tc.want, "#H") {
				t.Fatalf("Hashed(%q) = %v", got, h)
			}
			if !utf8.ValidString(got) {
				t.Fatalf("Encode(%q) = %q is not valid UTF-8", tc.in, got)
			}
		})
	}
}

func TestKeysDecode(t *testing.T) {
	for _, tc := range []struct {
		seg  string
		want string
		ok   bool
	}{
		{"", "", true},
		{"user-42", "user-42", true},
		{"a%23b", "a#b", true},
		{"%2523", "%23", true},
		{"a%FFb", "a\xffb", true},
		{"café", "café", true},
		// Hashed: the original lives in an attribute.
		{hashOf("x"), "", false},
		// Never produced by Encode.
		{"a#b", "", false},
		{"%", "", false},
		{"%2", "", false},
		{"%zz", "", false},
		{"%41", "", false},    // needless escape of 'A'
		{"%2f", "", false},    // lowercase hex
		{"%C3%A9", "", false}, // valid UTF-8 escaped needlessly
		{"a\xffb", "", false}, // raw invalid UTF-8
		{strings.Repeat("a", maxSegmentLen+1), "", false},
		{"#H" + strings.Repeat("A", 64), "", false}, // not a hash (uppercase), yet has '#'
	} {
		got, ok := Decode(tc.seg)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Decode(%q) = %q, %v; want %q, %v", tc.seg, got, ok, tc.want, tc.ok)
		}
	}
}

func TestKeysHashed(t *testing.T) {
	for _, tc := range []struct {
		seg  string
		want bool
	}{
		{hashOf(""), true},
		{hashOf(strings.Repeat("z", 600)), true},
		{"", false},
		{"#H", false},
		{"%23H" + strings.Repeat("0", 64), false},
		{"#H" + strings.Repeat("0", 63), false},
		{"#H" + strings.Repeat("0", 65), false},
		{"#H" + strings.Repeat("g", 64), false},
		{"#H" + strings.Repeat("F", 64), false},
		{"#X" + strings.Repeat("0", 64), false},
	} {
		if got := Hashed(tc.seg); got != tc.want {
			t.Errorf("Hashed(%q) = %v, want %v", tc.seg, got, tc.want)
		}
	}
}

func TestKeysLayout(t *testing.T) {
	const e, r = "user#1", "api%v"
	const ee, re = "user%231", "api%25v"
	long := strings.Repeat("é", 300) // 600 bytes: hashed
	lh := hashOf(long)
	for _, tc := range []struct {
		prefix string
		pre    string
	}{
		{"", ""},
		{"prod-eu.1:a_b", "prod-eu.1:a_b/"},
		{longestPrefix, longestPrefix + "/"},
	} {
		k := mustKeys(t, tc.prefix)
		if got := k.Prefix(); got != tc.prefix {
			t.Errorf("Prefix() = %q, want %q", got, tc.prefix)
		}
		for _, c := range []struct{ name, got, want string }{
			{"EntityPK", k.EntityPK(e), tc.pre + "ENTITY#" + ee},
			{"EntityPK plain", k.EntityPK("10.0.0.1"), tc.pre + "ENTITY#10.0.0.1"},
			{"EntityPK empty", k.EntityPK(""), tc.pre + "ENTITY#"},
			{"EntityPK hashed", k.EntityPK(long), tc.pre + "ENTITY#" + lh},
			{"BucketSK", k.BucketSK(r), "#BUCKET#" + re},
			{"BucketSK hashed", k.BucketSK(long), "#BUCKET#" + lh},
			{"ConfigSK", k.ConfigSK(r), "#CONFIG#" + re},
			{"ConfigSK default", k.ConfigSK("_default_"), "#CONFIG#_default_"},
			{"MetaSK", MetaSK(), "#META"},
			{"ResourcePK", k.ResourcePK(r), tc.pre + "RESOURCE#" + re},
			{"SystemPK", k.SystemPK(), tc.pre + "SYSTEM#"},
			{"ResourceConfigSK", ResourceConfigSK(), "#CONFIG"},
			{"GSI1PK", k.GSI1PK(e), tc.pre + "PARENT#" + ee},
			{"GSI1SK", GSI1SK(e), "CHILD#" + ee},
			{"GSI2PK", k.GSI2PK(r), tc.pre + "RESOURCE#" + re},
			{"GSI2SK", GSI2SK(e), "BUCKET#" + ee},
			{"GSI2SK hashed", GSI2SK(long), "BUCKET#" + lh},
		} {
			if c.got != c.want {
				t.Errorf("prefix %q: %s = %q, want %q", tc.prefix, c.name, c.got, c.want)
			}
		}
	}
	// The zero value is the unprefixed builder.
	if got := (Keys{}).EntityPK("a"); got != "ENTITY#a" {
		t.Errorf("Keys{}.EntityPK(a) = %q", got)
	}
}

func TestKeysNewKeysPrefix(t *testing.T) {
	for _, p := range []string{"", "a", "prod", "A-Z_0.9:x", longestPrefix, strings.Repeat("9", maxPrefixLen)} {
		if _, err := NewKeys(p); err != nil {
			t.Errorf("NewKeys(%q): unexpected error %v", p, err)
		}
	}
	for _, p := range []string{
		"a#b", "#", "a/b", "/", "has space", "ünïcode", "a\x00", "a\xff", "tab\t", "a%b", "a+b", "a,b",
		strings.Repeat("p", maxPrefixLen+1),
	} {
		k, err := NewKeys(p)
		if err == nil {
			t.Errorf("NewKeys(%q): want error", p)
		}
		if k.Prefix() != "" {
			t.Errorf("NewKeys(%q) returned a non-zero Keys on error", p)
		}
	}
}

func TestKeysRoundTrip(t *testing.T) {
	for _, s := range []string{
		"", "a", "#", "%", "%23", "%2523", "##%%", "a#b%c", "\xff\xfe", "é\xc3", "\uFFFD",
		"_default_", strings.Repeat("#", 170), strings.Repeat("a", maxSegmentLen),
	} {
		enc := Encode(s)
		if Hashed(enc) {
			t.Fatalf("Encode(%q) unexpectedly hashed", s)
		}
		got, ok := Decode(enc)
		if !ok || got != s {
			t.Errorf("Decode(Encode(%q)) = %q, %v", s, got, ok)
		}
	}
}

// checkSegment asserts everything Encode promises about one input.
func checkSegment(t testing.TB, s string) {
	t.Helper()
	enc := Encode(s)
	if !utf8.ValidString(enc) {
		t.Fatalf("Encode(%q) = %q: invalid UTF-8", s, enc)
	}
	if len(enc) > maxSegmentLen {
		t.Fatalf("Encode(%q): %d bytes, bound %d", s, len(enc), maxSegmentLen)
	}
	ref := refEscape(s)
	if len(ref) <= maxSegmentLen {
		if enc != ref {
			t.Fatalf("Encode(%q) = %q, reference escape %q", s, enc, ref)
		}
		if strings.Contains(enc, "#") || Hashed(enc) {
			t.Fatalf("Encode(%q) = %q: '#' in an escaped segment", s, enc)
		}
		if got, ok := Decode(enc); !ok || got != s {
			t.Fatalf("Decode(Encode(%q)) = %q, %v", s, got, ok)
		}
	} else {
		if enc != hashOf(s) || !Hashed(enc) {
			t.Fatalf("Encode(%q) = %q, want hash %q", s, enc, hashOf(s))
		}
		if strings.LastIndexByte(enc, '#') != 0 {
			t.Fatalf("Encode(%q) = %q: '#' beyond the hash marker", s, enc)
		}
		if _, ok := Decode(enc); ok {
			t.Fatalf("Decode(%q) of a hashed segment reported ok", enc)
		}
	}
}

// keyCase is one key kind, built from a data string.
type keyCase struct {
	name  string
	pk    bool   // partition key (2048-byte limit, prefixed) rather than sort key
	kind  string // the marker a parser must read back
	build func(k Keys, s string) string
}

var keyCases = []keyCase{
	{"EntityPK", true, entityMarker, Keys.EntityPK},
	{"ResourcePK", true, resourceMarker, Keys.ResourcePK},
	{"GSI1PK", true, parentMarker, Keys.GSI1PK},
	{"GSI2PK", true, resourceMarker, Keys.GSI2PK},
	{"SystemPK", true, systemMarker, func(k Keys, _ string) string { return k.SystemPK() }},
	{"BucketSK", false, bucketSKMarker, Keys.BucketSK},
	{"ConfigSK", false, configSKMarker, Keys.ConfigSK},
	{"MetaSK", false, metaSK, func(Keys, string) string { return MetaSK() }},
	{"ResourceConfigSK", false, resourceConfig, func(Keys, string) string { return ResourceConfigSK() }},
	{"GSI1SK", false, childMarker, func(_ Keys, s string) string { return GSI1SK(s) }},
	{"GSI2SK", false, bucketMarker, func(_ Keys, s string) string { return GSI2SK(s) }},
}

// parsePK splits a partition key the way a reader that knows nothing of
// the data would: the prefix is what precedes a '/' before the first '#',
// the kind runs up to and including the first '#', the rest is data.
func parsePK(key string) (prefix, kind, data string) {
	i := strings.IndexByte(key, '#')
	if i < 0 {
		return "", key, ""
	}
	if j := strings.IndexByte(key[:i], '/'); j >= 0 {
		prefix, key, i = key[:j], key[j+1:], i-j-1
	}
	return prefix, key[:i+1], key[i+1:]
}

// parseSK splits a sort key: "#WORD#" or "#WORD" for the table's sort keys,
// "WORD#" for the GSI ones, then data.
func parseSK(key string) (kind, data string) {
	if strings.HasPrefix(key, "#") {
		i := strings.IndexByte(key[1:], '#')
		if i < 0 {
			return key, ""
		}
		return key[:i+2], key[i+2:]
	}
	i := strings.IndexByte(key, '#')
	if i < 0 {
		return key, ""
	}
	return key[:i+1], key[i+1:]
}

// checkKeys asserts, for every key kind built from s, that it is valid
// UTF-8, non-empty and within DynamoDB's limits, and that a parser blind
// to the data reads back exactly the prefix, the kind and Encode(s): no
// data can forge another kind, leave its segment, or reach the prefix.
func checkKeys(t testing.TB, k Keys, s string) {
	t.Helper()
	enc := Encode(s)
	for _, kc := range keyCases {
		key := kc.build(k, s)
		limit := dynamoMaxSK
		if kc.pk {
			limit = dynamoMaxPK
		}
		if key == "" || len(key) > limit || !utf8.ValidString(key) {
			t.Fatalf("%s(%q) under prefix %q = %q: %d bytes (limit %d), valid UTF-8 %v",
				kc.name, s, k.Prefix(), key, len(key), limit, utf8.ValidString(key))
		}
		wantData := enc
		if key == kc.build(k, "") { // kinds that carry no data
			wantData = ""
		}
		var prefix, kind, data string
		if kc.pk {
			prefix, kind, data = parsePK(key)
		} else {
			kind, data = parseSK(key)
			prefix = k.Prefix() // sort keys carry no prefix
		}
		if prefix != k.Prefix() || kind != kc.kind || data != wantData {
			t.Fatalf("%s(%q) = %q parses as prefix %q kind %q data %q; want %q %q %q",
				kc.name, s, key, prefix, kind, data, k.Prefix(), kc.kind, wantData)
		}
		for _, m := range allMarkers {
			if strings.Contains(data, m) {
				t.Fatalf("%s(%q) = %q: data part %q carries marker %q", kc.name, s, key, data, m)
			}
		}
	}
}

// randomString draws from an alphabet chosen to stress the escaping:
// the escape characters and hex digits that could form fake escapes, the
// prefix separator, multibyte runes, and every kind of invalid byte.
func randomString(r *rand.Rand) string {
	alphabets := [][]string{
		{"#", "%", "2", "3", "5", "/"},
		{"#", "%", "%23", "%25", "23", "25", "#H", "H"},
		{"a", "Z", "0", ".", ":", "-", "_", " "},
		{"é", "€", "𝄞", "\uFFFD", "ß", "中"},
		{"\xff", "\x80", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x00"},
		{"ENTITY#", "#BUCKET#", "#CONFIG", "#META", "RESOURCE#", "SYSTEM#", "/", "_default_"},
	}
	// Mix one to three alphabets.
	var alpha []string
	for n := 1 + r.IntN(3); n > 0; n-- {
		alpha = append(alpha, alphabets[r.IntN(len(alphabets))]...)
	}
	// Half short; the rest a few hundred bytes, a third of those aimed at
	// an escaped length within a few bytes of the hashing bound (measured
	// piece by piece, so approximate where invalid pieces join into a rune).
	var b strings.Builder
	switch r.IntN(6) {
	case 0, 1, 2:
		for n := r.IntN(24); b.Len() < n; {
			b.WriteString(alpha[r.IntN(len(alpha))])
		}
	case 3, 4:
		for n := 150 + r.IntN(400); b.Len() < n; {
			b.WriteString(alpha[r.IntN(len(alpha))])
		}
	case 5:
		for n, esc := maxSegmentLen-6+r.IntN(12), 0; esc < n; {
			piece := alpha[r.IntN(len(alpha))]
			esc += len(refEscape(piece))
			b.WriteString(piece)
		}
	}
	return b.String()
}

func TestKeysProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 119))
	kp := mustKeys(t, longestPrefix)
	k0 := mustKeys(t, "")
	seen := make(map[string]string)
	hashed, below, above := 0, 0, 0
	for i := 0; i < 5000; i++ {
		s := randomString(r)
		enc := Encode(s)
		if prev, ok := seen[enc]; ok && prev != s {
			t.Fatalf("collision: Encode(%q) == Encode(%q) == %q", prev, s, enc)
		}
		seen[enc] = s
		if Hashed(enc) {
			hashed++
		}
		switch n := len(refEscape(s)); {
		case n > maxSegmentLen-4 && n <= maxSegmentLen:
			below++
		case n > maxSegmentLen && n <= maxSegmentLen+4:
			above++
		}
		checkSegment(t, s)
		checkKeys(t, kp, s)
		checkKeys(t, k0, s)
	}
	t.Logf("%d distinct, %d hashed, %d/%d escaping to at most/more than the bound, within 4 bytes",
		len(seen), hashed, below, above)
	// The generator must actually reach both sides of the bound.
	if hashed < 300 || below < 50 || above < 50 || len(seen) < 3000 {
		t.Fatalf("weak generator: %d distinct, %d hashed, %d/%d within 4 bytes of the bound",
			len(seen), hashed, below, above)
	}
}

func FuzzKeys(f *testing.F) {
	for _, p := range [][2]string{
		{"", ""},
		{"", "#"},
		{"a#b", "a%23b"},
		{"%", "%25"},
		{"#", "%23"},
		{"\xff", "%FF"},
		{"\xc3\xa9", "é"},
		{"x#BUCKET#y", "x"},
		{"_default_", "#CONFIG#_default_"},
		{"#H" + strings.Repeat("0", 64), strings.Repeat("0", 64)},
		{strings.Repeat("#", 170), strings.Repeat("#", 171)},
		{strings.Repeat("a", maxSegmentLen), strings.Repeat("a", maxSegmentLen+1)},
		{"p/ENTITY#x", "x"},
	} {
		f.Add(p[0], p[1])
	}
	kp := mustKeys(f, longestPrefix)
	k0 := mustKeys(f, "")
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, s := range []string{a, b} {
			checkSegment(t, s)
			checkKeys(t, kp, s)
			checkKeys(t, k0, s)
		}
		if a == b {
			return
		}
		if Encode(a) == Encode(b) {
			t.Fatalf("Encode(%q) == Encode(%q)", a, b)
		}
		for _, k := range []Keys{k0, kp} {
			if k.EntityPK(a) == k.EntityPK(b) {
				t.Fatalf("EntityPK(%q) == EntityPK(%q) under %q", a, b, k.Prefix())
			}
			if k.BucketSK(a) == k.BucketSK(b) {
				t.Fatalf("BucketSK(%q) == BucketSK(%q)", a, b)
			}
			if k.ConfigSK(a) == k.ConfigSK(b) || k.ResourcePK(a) == k.ResourcePK(b) ||
				k.GSI1PK(a) == k.GSI1PK(b) || GSI1SK(a) == GSI1SK(b) || GSI2SK(a) == GSI2SK(b) {
				t.Fatalf("a key kind maps %q and %q to the same key", a, b)
			}
		}
		// Different kinds never meet, whatever the data, nor do prefixed
		// and unprefixed keys.
		for _, k := range []Keys{k0, kp} {
			pks := []string{k.EntityPK(a), k.ResourcePK(b), k.GSI1PK(b), k.SystemPK(), kp.EntityPK(b)}
			if k == kp {
				pks[len(pks)-1] = k0.EntityPK(b)
			}
			sks := []string{k.BucketSK(a), k.ConfigSK(b), MetaSK(), ResourceConfigSK()}
			for _, set := range [][]string{pks, sks, {GSI1SK(a), GSI2SK(b)}} {
				for i := range set {
					for j := i + 1; j < len(set); j++ {
						if set[i] == set[j] {
							t.Fatalf("different kinds share key %q (a=%q b=%q)", set[i], a, b)
						}
					}
				}
			}
		}
	})
}

// FuzzBucketKey checks the key of a bucket item as the backend writes it
// (Backend.itemKey: PK and SK together), under no prefix, a short one and
// the longest: two different (entity, resource) pairs never get one item,
// whether the difference is in the entity, the resource or where a '#',
// '%' or '/' falls between them; no pair's item is another pair's under
// another prefix; and no data, '#' included, can make the item read back
// as a key of another kind or as another pair: a reader blind to the data
// gets back ENTITY# and #BUCKET# and exactly the entity and resource (or,
// past the length bound, their hashes). GSI2's pair (resource, entity) is
// held to the same.
func FuzzBucketKey(f *testing.F) {
	long := strings.Repeat("a", maxSegmentLen+1)
	for _, s := range [][4]string{
		{"10.0.0.1", "edge/remote_address", "10.0.0.1", "edge/remote_address"},
		{"a", "b#", "a#", "b"},
		{"a#", "b", "a", "#b"},
		{"a", "#BUCKET#b", "a#BUCKET#", "b"},
		{"x", "#META", "x#META", ""},
		{"x", "_default_", "x#CONFIG#_default_", ""},
		{"%23", "r", "#", "r"},
		{"a/b", "c", "a", "b/c"},
		{"p/ENTITY#x", "r", "x", "r"},
		{"ENTITY#x", "r", "x", "r"},
		{"", "", "", "#"},
		{"\xff", "r", "%FF", "r"},
		{long, "r", hashOf(long), "r"},
		{long, "r", hashOf(long)[2:], "r"},
		{"e", strings.Repeat("#", 171), "e", strings.Repeat("#", 170)},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	var keys []Keys
	for _, p := range []string{"", "p", longestPrefix} {
		keys = append(keys, mustKeys(f, p))
	}
	item := func(k Keys, e, r string) itemKey {
		av := (&Backend{keys: k}).itemKey(bucketKey{entity: e, resource: r})
		return itemKey{av[attrPK].(*types.AttributeValueMemberS).Value, av[attrSK].(*types.AttributeValueMemberS).Value}
	}
	f.Fuzz(func(t *testing.T, e1, r1, e2, r2 string) {
		same := e1 == e2 && r1 == r2
		for i, k := range keys {
			for _, er := range [][2]string{{e1, r1}, {e2, r2}} {
				checkBucketItem(t, k, er[0], er[1], item(k, er[0], er[1]))
			}
			a, b := item(k, e1, r1), item(k, e2, r2)
			if (a == b) != same {
				t.Fatalf("prefix %q: (%q, %q) -> %v and (%q, %q) -> %v", k.Prefix(), e1, r1, a, e2, r2, b)
			}
			ga := itemKey{k.GSI2PK(r1), GSI2SK(e1)}
			if gb := (itemKey{k.GSI2PK(r2), GSI2SK(e2)}); (ga == gb) != same {
				t.Fatalf("prefix %q: GSI2 keys of (%q, %q) and (%q, %q): %v and %v", k.Prefix(), e1, r1, e2, r2, ga, gb)
			}
			for _, other := range keys[i+1:] {
				if item(other, e2, r2) == a || item(other, e1, r1) == a {
					t.Fatalf("the item of (%q, %q) under prefix %q is also one under prefix %q", e1, r1, k.Prefix(), other.Prefix())
				}
			}
			// Whatever the data, a bucket is no meta, config or system item.
			for _, o := range []itemKey{
				{k.EntityPK(e2), MetaSK()}, {k.EntityPK(e2), k.ConfigSK(r2)}, {k.EntityPK(r2), k.ConfigSK(e2)},
				{k.ResourcePK(r2), ResourceConfigSK()}, {k.ResourcePK(e2), ResourceConfigSK()}, {k.SystemPK(), ResourceConfigSK()},
			} {
				if o == a {
					t.Fatalf("the bucket (%q, %q) has the key of another item kind: %v", e1, r1, o)
				}
			}
		}
	})
}

// itemKey is the primary key of an item: PK and SK.
type itemKey struct{ pk, sk string }

// checkBucketItem reads a bucket item's key back as a reader that knows
// only the layout would, and checks it names exactly (e, r) under k.
func checkBucketItem(t *testing.T, k Keys, e, r string, key itemKey) {
	t.Helper()
	prefix, kind, eSeg := parsePK(key.pk)
	skKind, rSeg := parseSK(key.sk)
	if prefix != k.Prefix() || kind != entityMarker || skKind != bucketSKMarker {
		t.Fatalf("bucket (%q, %q) under %q: PK %q SK %q read back as prefix %q, kinds %q and %q",
			e, r, k.Prefix(), key.pk, key.sk, prefix, kind, skKind)
	}
	for _, c := range []struct{ what, seg, orig string }{{"entity", eSeg, e}, {"resource", rSeg, r}} {
		got, ok := Decode(c.seg)
		if (!ok && !(Hashed(c.seg) && c.seg == hashOf(c.orig))) || (ok && got != c.orig) {
			t.Fatalf("bucket (%q, %q): the %s reads back from %q as %q (ok %v)", e, r, c.what, c.seg, got, ok)
		}
	}
}
