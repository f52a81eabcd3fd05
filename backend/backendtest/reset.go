package backendtest

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// Reset is an Admin's ResetBucket.
type Reset func(ctx context.Context, entity, resource, limit string) (backend.Bucket, bool, error)

// ResetsBuckets holds a store's bucket reset (sluice buckets reset) to
// what an operator relies on, on a bucket of two limits (20 requests and
// 1,000 tokens a minute) that d, a replica without leases, decides on:
// a reset of one limit makes it full and leaves the other as it was, a
// reset of the bucket makes every limit full, each says what the bucket
// held, an unknown limit is refused naming those it has, and a bucket
// never written is not found.
func ResetsBuckets(t *testing.T, d Decider, reset Reset) {
	t.Helper()
	ctx := context.Background()
	rpm := bucket.Limit{Name: "rpm", Amount: 20 * bucket.Milli, Period: bucket.Minute, Burst: 20 * bucket.Milli, PerRequest: true}
	tpm := bucket.Limit{Name: "tpm", Amount: 1000 * bucket.Milli, Period: bucket.Minute, Burst: 1000 * bucket.Milli}
	left := func(what string, hits uint64) (rpmLeft, tpmLeft int64) {
		t.Helper()
		dec, err := d.Decide(ctx, &backend.Request{Entity: "acme", Resource: "chat", Defaults: []bucket.Limit{rpm, tpm}, Hits: hits})
		if err != nil || !dec.Allowed || len(dec.Results) != 2 {
			t.Fatalf("%s: %+v, %v", what, dec, err)
		}
		var l [2]int64
		for i, lim := range dec.Limits {
			if lim.Name == "tpm" {
				l[1] = dec.Results[i].Tokens / bucket.Milli
			} else {
				l[0] = dec.Results[i].Tokens / bucket.Milli
			}
		}
		return l[0], l[1]
	}
	for range 3 {
		left("a request of 100 tokens", 100)
	}
	before, ok, err := reset(ctx, "acme", "chat", "tpm")
	if err != nil || !ok {
		t.Fatalf("resetting tpm: %v, %v", ok, err)
	}
	for i, l := range before.Limits {
		if s := before.States[i]; l.Name == "tpm" && (s.Tokens > 701*bucket.Milli || s.Tokens < 700*bucket.Milli) {
			t.Errorf("the reset says tpm held %d millitokens, want about 700000", s.Tokens)
		}
	}
	// Refill of a few ms may add a little: 1,000 a minute is one token
	// in 60 ms.
	if r, tk := left("after tpm's reset", 1); r != 16 || tk < 999 {
		t.Errorf("after a reset of tpm: rpm %d left (want 16: untouched), tpm %d (want 999: full, less this request)", r, tk)
	}
	if _, _, err := reset(ctx, "acme", "chat", "rpx"); err == nil || !strings.Contains(err.Error(), "rpm, tpm") {
		t.Errorf("resetting a limit the bucket has not: %v, want an error naming rpm, tpm", err)
	}
	if _, ok, err := reset(ctx, "acme", "chat", ""); err != nil || !ok {
		t.Fatalf("resetting the bucket: %v, %v", ok, err)
	}
	if r, tk := left("after the bucket's reset", 1); r != 19 || tk != 999 {
		t.Errorf("after a reset of the bucket: rpm %d, tpm %d left; want 19 and 999 (full, less this request)", r, tk)
	}
	if _, ok, err := reset(ctx, "nobody", "chat", ""); err != nil || ok {
		t.Errorf("resetting a bucket never written: found %v, %v", ok, err)
	}
}
