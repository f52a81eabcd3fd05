package dynamodb

import (
	"fmt"

	"github.com/sluice-rl/sluice/backend/keyseg"
)

// Key layout (DESIGN section 6). Every key is a fixed marker followed by at
// most one encoded segment. The markers of the PK side end in '#' and
// contain no '/', those of the SK side start with '#'; since an encoded
// segment never contains a raw '#' (see Encode), a key's kind and the
// boundary between marker and data can always be read back unambiguously.
const (
	entityMarker   = "ENTITY#"
	resourceMarker = "RESOURCE#"
	systemMarker   = "SYSTEM#"
	parentMarker   = "PARENT#"
	bucketSKMarker = "#BUCKET#"
	configSKMarker = "#CONFIG#"
	metaSK         = "#META"
	resourceConfig = "#CONFIG"
	childMarker    = "CHILD#"
	bucketMarker   = "BUCKET#"

	// prefixSep separates the deployment prefix from the key. The prefix
	// may not contain it (nor '#'), so the text before the first '/' of a
	// prefixed key is exactly the prefix, and an unprefixed key, which has
	// no '/' before its first '#', can never equal a prefixed one.
	prefixSep = "/"

	// maxPrefixLen is the longest deployment prefix NewKeys accepts.
	maxPrefixLen = 64

	// maxSegmentLen is the longest escaped segment kept readable
	// (keyseg.MaxLen); longer ones are hashed. DynamoDB allows 2048 bytes
	// for a partition key and 1024 for a sort key (GSI keys included); with the longest prefix and
	// marker the longest key is 64+1+9+512 = 586 bytes for a PK and
	// 8+512 = 520 for an SK, well inside both. The bound is deliberately
	// lower than the limits allow: a bucket item repeats the entity and
	// the resource in two keys each, and key bytes count toward the item
	// size that write capacity (1 KB units) is billed on. Real entities
	// (addresses, host names, header values) are far shorter.
	maxSegmentLen = keyseg.MaxLen

	// hashMarker starts a hashed segment. An escaped segment never contains
	// a raw '#', so no escaped form can equal a hashed one.
	hashMarker = keyseg.HashMarker
)

// Keys builds the keys of every item kind, under an optional prefix that
// lets several deployments or test runs share one table. The zero value
// builds unprefixed keys.
type Keys struct {
	prefix string
}

// NewKeys returns the key builder for prefix. The prefix is either empty or
// 1 to 64 characters from [A-Za-z0-9_.:-]: it is written into every
// partition key verbatim, so it must contain neither '#' (which would blur
// the kind marker) nor '/' (the prefix separator), and it is configuration,
// never request data, so it is validated rather than encoded.
func NewKeys(prefix string) (Keys, error) {
	if err := validPrefix(prefix); err != nil {
		return Keys{}, err
	}
	return Keys{prefix: prefix}, nil
}

func validPrefix(p string) error {
	if p == "" {
		return nil
	}
	if len(p) > maxPrefixLen {
		return fmt.Errorf("dynamodb: key prefix is %d bytes, at most %d allowed", len(p), maxPrefixLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '_', c == '.', c == ':', c == '-':
		default:
			return fmt.Errorf("dynamodb: key prefix %q: byte %q at %d not in [A-Za-z0-9_.:-]", p, c, i)
		}
	}
	return nil
}

// pk puts the deployment prefix in front of a partition key.
func (k Keys) pk(marker, seg string) string {
	if k.prefix == "" {
		return marker + seg
	}
	return k.prefix + prefixSep + marker + seg
}

// EntityPK is the partition key of an entity's items (buckets, meta,
// configs): ENTITY#{entity}.
func (k Keys) EntityPK(entity string) string { return k.pk(entityMarker, Encode(entity)) }

// BucketSK is the sort key of the bucket an entity holds for a resource:
// #BUCKET#{resource}.
func (k Keys) BucketSK(resource string) string { return bucketSKMarker + Encode(resource) }

// ConfigSK is the sort key of an entity's config for a resource:
// #CONFIG#{resource}. The resource "_default_" (the entity-wide default)
// is encoded like any other; it needs no escaping.
func (k Keys) ConfigSK(resource string) string { return configSKMarker + Encode(resource) }

// MetaSK is the sort key of an entity's meta item.
func MetaSK() string { return metaSK }

// ResourcePK is the partition key of a resource's config item:
// RESOURCE#{resource}.
func (k Keys) ResourcePK(resource string) string { return k.pk(resourceMarker, Encode(resource)) }

// SystemPK is the partition key of the system config item.
func (k Keys) SystemPK() string { return k.pk(systemMarker, "") }

// ResourceConfigSK is the sort key of the resource and system config items.
func ResourceConfigSK() string { return resourceConfig }

// GSI1PK finds the children of parent: PARENT#{parent}.
func (k Keys) GSI1PK(parent string) string { return k.pk(parentMarker, Encode(parent)) }

// GSI1SK is the GSI1 sort key of an entity's meta item: CHILD#{entity}.
// Sort keys carry no prefix; the partition key already does.
func GSI1SK(entity string) string { return childMarker + Encode(entity) }

// GSI2PK finds the buckets of resource: RESOURCE#{resource}. It is the same
// string as ResourcePK on purpose; the two live in different attributes.
func (k Keys) GSI2PK(resource string) string { return k.pk(resourceMarker, Encode(resource)) }

// GSI2SK is the GSI2 sort key of a bucket: BUCKET#{entity}.
func GSI2SK(entity string) string { return bucketMarker + Encode(entity) }

// Encode turns request data into a key segment (keyseg.Encode): '%' and
// '#' escaped, as is every byte that is not valid UTF-8 (DynamoDB rejects
// invalid UTF-8), and hashed past maxSegmentLen bytes. The key markers
// end or start with '#', which an encoded segment never contains raw.
func Encode(s string) string { return keyseg.Encode(s, "") }
