package redis

import (
	"strings"
	"testing"
)

// Distinct (entity, resource) pairs never share a key, whatever bytes
// they hold; a cascade's two buckets share a hash tag; configuration and
// buckets never meet; prefixes separate deployments.
func TestKeys(t *testing.T) {
	var k Keys
	pairs := [][2]string{{"a:b", "c"}, {"a", "b:c"}, {"a", "b%3Ac"}, {"{x}", "r"}, {"x", "r"}, {"", "r"}, {"a#H", "r"},
		{strings.Repeat("e", 600), "r"}, {strings.Repeat("e", 601), "r"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		for _, key := range []string{k.Bucket(p[0], p[1], ""), k.EntityConfig(p[0], p[1])} {
			if q, dup := seen[key]; dup {
				t.Errorf("%q and %q share the key %q", p, q, key)
			}
			seen[key] = p
			if strings.Count(key, "{") > 1 || strings.Count(key, "}") > 1 {
				t.Errorf("key %q holds a brace besides its hash tag's", key)
			}
		}
	}
	child, parent := k.Bucket("user-1", "chat", "org:7"), k.Bucket("org:7", "chat", "")
	if hashTag(child) != hashTag(parent) || hashTag(child) != "org%3A7" {
		t.Errorf("a cascade's buckets %q and %q do not share a hash tag", child, parent)
	}
	if hashTag(k.Bucket("user-1", "chat", "")) == hashTag(k.Bucket("user-2", "chat", "")) {
		t.Error("unrelated buckets share a hash tag: a hot resource would sit on one node")
	}
	if got := k.Bucket("e", "r", ""); got != "sluice:b:{e}:e:r" {
		t.Errorf("default prefix: %q", got)
	}
	p, err := NewKeys("staging-2")
	if err != nil || p.SystemConfig() == k.SystemConfig() || !strings.HasPrefix(p.Meta("e"), "staging-2:m:") {
		t.Errorf("prefix: %v %q", err, p.SystemConfig())
	}
	for _, bad := range []string{"a:b", "{x}", strings.Repeat("p", 65), "a b"} {
		if _, err := NewKeys(bad); err == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
}

// hashTag reads a key as Redis Cluster does to pick its slot.
func TestHashTag(t *testing.T) {
	for key, want := range map[string]string{
		"sluice:b:{org}:u:r": "org",
		"a{b}c{d}":           "b",
		"a}{b}":              "b",
		"a{}b{c}":            "a{}b{c}", // an empty tag is none: the whole key
		"a{b":                "a{b",
		"plain":              "plain",
	} {
		if got := hashTag(key); got != want {
			t.Errorf("hashTag(%q) = %q, want %q", key, got, want)
		}
	}
}
