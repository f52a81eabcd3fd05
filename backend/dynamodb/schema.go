package dynamodb

// The table layout (DESIGN section 6). One table holds every item; the
// partition key PK and sort key SK are strings, and DynamoDB's TTL
// deletes items whose ttl (epoch seconds) has passed.
const (
	attrPK     = "PK"
	attrSK     = "SK"
	attrTTL    = "ttl"
	attrGSI1PK = "GSI1PK"
	attrGSI1SK = "GSI1SK"
	attrGSI2PK = "GSI2PK"
	attrGSI2SK = "GSI2SK"

	// GSI1 finds an entity's children (parent -> children), GSI2 a
	// resource's buckets (resource -> buckets).
	indexGSI1 = "GSI1"
	indexGSI2 = "GSI2"
)
