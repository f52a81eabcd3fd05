package redis

import (
	"fmt"
	"strings"

	"github.com/sluice-rl/sluice/backend/keyseg"
)

// Key layout. Every key is the deployment prefix, a kind, then segments
// joined by ':'. Segments are request data encoded by keyseg with ':',
// '{' and '}' reserved, so a segment never holds a separator or a brace:
// the kinds and segments of a key read back unambiguously, and the only
// braces in a key are the hash tag's.
//
//	{prefix}:b:{<tag>}:<entity>:<resource>    a bucket (a hash of every limit)
//	{prefix}:c:e:<entity>:<resource>          an entity's config for a resource (_default_ too)
//	{prefix}:c:r:<resource>                   a resource default
//	{prefix}:c:s                              the system default
//	{prefix}:m:<entity>                       an entity's META (parent, cascade)
//	{prefix}:a                                the records the last `sluice limits apply` wrote
//
// A bucket's hash tag is its top entity: the end of the chain of parents
// it cascades to (its own entity when it has none). Redis Cluster puts
// keys with one tag in one slot, so the script of a cascade, which writes
// the child's bucket and the parent's, runs on one node, and so does a
// hierarchy of any depth (a user cascading to a team, the team to an
// org). A bucket moves, and starts full, when its chain of parents
// changes.
const reserved = ":{}"

// DefaultPrefix is the prefix of every key when none is configured.
const DefaultPrefix = "sluice"

// Keys builds the keys under one prefix. The zero value uses
// DefaultPrefix.
type Keys struct{ prefix string }

// NewKeys returns the key builder for prefix: empty for DefaultPrefix, or
// 1 to 64 bytes of [A-Za-z0-9_.-] (configuration, validated rather than
// encoded), so several deployments can share one Redis.
func NewKeys(prefix string) (Keys, error) {
	if len(prefix) > 64 {
		return Keys{}, fmt.Errorf("redis: key prefix is %d bytes, at most 64 allowed", len(prefix))
	}
	for _, c := range []byte(prefix) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return Keys{}, fmt.Errorf("redis: key prefix %q: only letters, digits and _.- are allowed", prefix)
		}
	}
	return Keys{prefix: prefix}, nil
}

func (k Keys) base() string {
	if k.prefix == "" {
		return DefaultPrefix
	}
	return k.prefix
}

func seg(s string) string { return keyseg.Encode(s, reserved) }

// Bucket is the key of the bucket of (entity, resource); top is the end
// of entity's chain of cascade parents, "" when it has none.
func (k Keys) Bucket(entity, resource, top string) string {
	tag := entity
	if top != "" {
		tag = top
	}
	return k.base() + ":b:{" + seg(tag) + "}:" + seg(entity) + ":" + seg(resource)
}

// EntityConfig is the key of entity's config for resource.
func (k Keys) EntityConfig(entity, resource string) string {
	return k.base() + ":c:e:" + seg(entity) + ":" + seg(resource)
}

// ResourceConfig is the key of resource's default.
func (k Keys) ResourceConfig(resource string) string { return k.base() + ":c:r:" + seg(resource) }

// SystemConfig is the key of the system default.
func (k Keys) SystemConfig() string { return k.base() + ":c:s" }

// Meta is the key of entity's META.
func (k Keys) Meta(entity string) string { return k.base() + ":m:" + seg(entity) }

// hashTag is the part of key Redis Cluster hashes to pick its slot: what
// the first '{' and the next '}' enclose, when that is not empty, else
// the whole key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	n := strings.IndexByte(key[open+1:], '}')
	if n <= 0 {
		return key
	}
	return key[open+1 : open+1+n]
}
