package dynamodb

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// farTable answers reads delay late too, as a table that far away would;
// slowWrites delays the writes.
type farTable struct{ slowWrites }

func (f farTable) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	time.Sleep(f.delay)
	return f.API.BatchGetItem(ctx, in, o...)
}

func (f farTable) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	time.Sleep(f.delay)
	return f.API.GetItem(ctx, in, o...)
}

// A key's first decision on a replica costs one round trip: its write
// goes out on the limits a key with no records of its own has while its
// records are read, and the records confirm them. Timed against a table
// 300 ms away: one round trip, not a read and then a write (600 ms), with
// 150 ms to spare for a busy machine.
func TestFirstDecisionIsOneRoundTrip(t *testing.T) {
	const delay = 300 * time.Millisecond
	e := newEnv(t)
	roomy := []bucket.Limit{lim(t, "x", "1000/s", 0)}
	for _, horizon := range []time.Duration{-1, 0} {
		t.Run(fmt.Sprintf("horizon=%v", horizon), func(t *testing.T) {
			b := e.replica(t, Options{LeaseHorizon: horizon}, farTable{slowWrites{e.client, delay}})
			decide := func(entity string) (backend.Decision, time.Duration) {
				t.Helper()
				start := time.Now()
				d := mustDecide(t, b, backend.Request{Entity: entity, Resource: "r", Defaults: roomy, Hits: 1})
				return d, time.Since(start)
			}
			// The resource's first key: nothing to guess from yet.
			if d, took := decide(fmt.Sprint("first", horizon)); !d.Allowed || took < 2*delay {
				t.Fatalf("the resource's first key: %+v in %v, want allowed after a read and a write", d, took)
			}
			calls0, _ := b.Stats().Calls()
			d, took := decide(fmt.Sprint("second", horizon))
			if !d.Allowed || d.Level != backend.LevelResource {
				t.Fatalf("a new key: %+v", d)
			}
			if took >= delay*3/2 {
				t.Errorf("a new key's first decision took %v: more than one round trip of %v", took, delay)
			}
			calls, _ := b.Stats().Calls()
			if n := calls["BatchGetItem"] - calls0["BatchGetItem"]; n != 1 {
				t.Errorf("%d config reads, want 1", n)
			}
			if n := calls["UpdateItem"] + calls["PutItem"] - calls0["UpdateItem"] - calls0["PutItem"]; n != 1 {
				t.Errorf("%d writes, want 1", n)
			}
			if r, w := b.Stats().GuessesRight.Load(), b.Stats().GuessesWrong.Load(); r != 1 || w != 0 {
				t.Errorf("guesses right %d, wrong %d; want 1 and 0", r, w)
			}
		})
	}
}

// A replica's first decision on a bucket another replica made, with the
// same limits and full again, writes it once, guessed and unseen: the
// write that creates or takes from a full bucket does not lose its race
// to the replica that created it. Every token both took is in the item.
func TestGuessedWriteOnAnotherReplicasBucket(t *testing.T) {
	e := newEnv(t)
	roomy := []bucket.Limit{lim(t, "x", "10/s", 10)}
	a := e.replica(t, Options{LeaseHorizon: -1})
	b := e.replica(t, Options{LeaseHorizon: -1})
	req := func(entity string, hits uint64) backend.Request {
		return backend.Request{Entity: entity, Resource: "r", Defaults: roomy, Hits: hits}
	}
	mustDecide(t, b, req("warm-b", 1)) // b has read the resource's records
	mustDecide(t, a, req("k", 4))
	e.clock.advance(1_000) // refilled: the bucket is full again
	calls0, _ := b.Stats().Calls()
	if d := mustDecide(t, b, req("k", 3)); !d.Allowed {
		t.Fatalf("denied: %+v", d)
	}
	calls, _ := b.Stats().Calls()
	if b.Stats().GuessesRight.Load() != 1 || b.Stats().ConditionRetries.Load() != 0 ||
		calls["UpdateItem"]-calls0["UpdateItem"] != 1 || calls["PutItem"] != calls0["PutItem"] {
		t.Fatalf("guessed first write on a full bucket: calls %v (before %v), %d retries, %d right guesses",
			calls, calls0, b.Stats().ConditionRetries.Load(), b.Stats().GuessesRight.Load())
	}
	item := e.rawItem(t, "ENTITY#k", "#BUCKET#r")
	if tk, tc := attrN(t, item, limitAttr(bucketPrefix, "x", fieldTokens)), attrN(t, item, limitAttr(bucketPrefix, "x", fieldConsumed)); tk != 7*bucket.Milli || tc != 7*bucket.Milli {
		t.Fatalf("bucket holds %d millitokens, %d taken in all; want 7000 and 7000 (full 10, less 3; 4 + 3 taken)", tk, tc)
	}
	// Not full: the guessed write loses its race and is decided again on
	// the item, as any write would be.
	mustDecide(t, a, req("k2", 9))
	c := e.replica(t, Options{LeaseHorizon: -1})
	mustDecide(t, c, req("warm-c", 1))
	if d := mustDecide(t, c, req("k2", 1)); !d.Allowed || d.Results[0].Tokens != 0 {
		t.Fatalf("the last token of a bucket another replica drained: %+v", d)
	}
	if d := mustDecide(t, c, req("k2", 1)); d.Allowed {
		t.Fatalf("a drained bucket admitted: %+v", d)
	}
}

// A wrong guess is decided again on the records: an entity with limits of
// its own gets those limits, its bucket their fingerprint and no ttl (an
// operator's config), and the calls of many fresh replicas together admit
// no more than its burst, whether its bucket exists yet or not.
func TestWrongGuessIsDecidedOnTheRecords(t *testing.T) {
	e := newEnv(t)
	roomy := []bucket.Limit{lim(t, "x", "1000/s", 0)}
	tight := []bucket.Limit{lim(t, "x", "1/h", 3)}
	ctx := context.Background()
	for _, leases := range []bool{false, true} {
		horizon := time.Duration(-1)
		if leases {
			horizon = 0
		}
		vip := fmt.Sprint("vip-", leases)
		if _, err := e.admin(t, "").PutConfig(ctx, backend.RecordKey{Entity: vip, Resource: "r"}, tight, 0); err != nil {
			t.Fatal(err)
		}
		var wrong uint64
		// Two rounds of 4 fresh replicas: the first finds no bucket, the
		// second finds it under the entity's limits.
		for round := range 2 {
			admitted := 0
			var held int64 // whole tokens the round's leases hold at its end
			var mu sync.Mutex
			var wg sync.WaitGroup
			for r := range 4 {
				b := e.replica(t, Options{LeaseHorizon: horizon})
				mustDecide(t, b, backend.Request{Entity: fmt.Sprint("warm", r, round, leases), Resource: "r", Defaults: roomy, Hits: 1})
				for range 5 {
					wg.Go(func() {
						d, err := b.Decide(ctx, &backend.Request{Entity: vip, Resource: "r", Defaults: roomy, Hits: 1})
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							t.Errorf("%s: %v", vip, err)
							return
						}
						if d.Level != backend.LevelEntity {
							t.Errorf("%s decided at level %v", vip, d.Level)
						}
						if d.Allowed {
							admitted++
						}
					})
				}
				wg.Wait()
				wrong += b.Stats().GuessesWrong.Load()
				if b.leases != nil {
					lb := backend.LeaseBucket[bucketKey]{Key: bucketKey{vip, "r"}, Res: backend.Resolved{Limits: tight}, FP: bucket.Fingerprint(tight)}
					for _, n := range b.leases.Peek(&lb) {
						held += n / bucket.Milli
					}
				}
			}
			// Every token is spent by a call, on a wrong guess too, or
			// (rarely, on a busy machine) held by the lease of a replica
			// whose calls had all been answered when its renewal landed:
			// none is lost, and none admitted twice.
			if want := [2]int64{3, 0}[round]; int64(admitted)+held != want || (!leases && held != 0) {
				t.Errorf("leases %v, round %d: %s admitted %d of 20 calls on 4 fresh replicas and %d tokens are on lease, want %d in all (its burst is 3, 1 an hour)",
					leases, round, vip, admitted, held, want)
			}
		}
		if wrong == 0 {
			t.Errorf("leases %v: no wrong guess counted", leases)
		}
		item := e.rawItem(t, "ENTITY#"+vip, "#BUCKET#r")
		if _, ok := item[attrTTL]; ok {
			t.Errorf("leases %v: an operator entity's bucket has a ttl", leases)
		}
		if cfg := attrS(item, attrCfg); cfg != bucket.Fingerprint(tight) {
			t.Errorf("leases %v: bucket cfg %q, want the entity's limits %q", leases, cfg, bucket.Fingerprint(tight))
		}
	}
}

// An entity whose META item asks for cascade is guessed without a parent:
// the guess is wrong, and the call is decided again on both buckets.
func TestWrongGuessFindsTheCascade(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	roomy := []bucket.Limit{lim(t, "x", "1000/s", 0)}
	a := e.admin(t, "")
	if err := a.PutEntity(ctx, backend.Entity{Name: "child", Parent: "org", Cascade: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutConfig(ctx, backend.RecordKey{Entity: "org", Resource: "r"}, []bucket.Limit{lim(t, "x", "1/h", 2)}, 0); err != nil {
		t.Fatal(err)
	}
	b := e.replica(t, Options{LeaseHorizon: -1})
	mustDecide(t, b, backend.Request{Entity: "warm", Resource: "r", Defaults: roomy, Hits: 1})
	admitted := 0
	for range 4 {
		if mustDecide(t, b, backend.Request{Entity: "child", Resource: "r", Defaults: roomy, Hits: 1}).Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("child of a parent with 2 tokens admitted %d of 4", admitted)
	}
	if b.Stats().GuessesWrong.Load() != 1 {
		t.Fatalf("%d wrong guesses, want 1", b.Stats().GuessesWrong.Load())
	}
}

// A wrong guess that created the bucket leaves it as new under the
// records' limits: an entity whose own records raise the resource's 20 a
// minute to 100 starts with 100 tokens, not the 20 of the guess (a bucket
// reconciled from the guessed one kept them: its first call answered 18
// with leases on), every answer is one bucket's, and so is the table once
// the leases are back.
func TestWrongGuessStartsTheBucketFull(t *testing.T) {
	e := newEnv(t)
	guessed := []bucket.Limit{lim(t, "x", "20/min", 0)}
	own := []bucket.Limit{lim(t, "x", "100/min", 100)}
	for _, horizon := range []time.Duration{-1, 0} {
		t.Run(fmt.Sprintf("horizon=%v", horizon), func(t *testing.T) {
			vip := fmt.Sprint("vip", horizon)
			if _, err := e.admin(t, "").PutConfig(context.Background(), backend.RecordKey{Entity: vip, Resource: "r"}, own, 0); err != nil {
				t.Fatal(err)
			}
			b := e.replica(t, Options{LeaseHorizon: horizon})
			mustDecide(t, b, backend.Request{Entity: fmt.Sprint("warm", horizon), Resource: "r", Defaults: guessed, Hits: 1})
			const n = 5
			for i := int64(1); i <= n; i++ {
				d := mustDecide(t, b, backend.Request{Entity: vip, Resource: "r", Defaults: guessed, Hits: 1})
				if !d.Allowed || d.Level != backend.LevelEntity || d.Results[0].Tokens != (100-i)*bucket.Milli {
					t.Fatalf("call %d: %+v, want allowed with %d millitokens left, at the entity's level", i, d, (100-i)*bucket.Milli)
				}
				// 100 a minute: full again 600 ms a token from now.
				if want := i * 600; d.Results[0].Wait != want {
					t.Errorf("call %d: full again in %d ms, want %d", i, d.Results[0].Wait, want)
				}
				if b.leases != nil {
					waitBackground(t, b)
				}
			}
			if w := b.Stats().GuessesWrong.Load(); w != 1 {
				t.Errorf("%d wrong guesses, want 1", w)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if tk := e.tokensIn(t, b, vip, "r", "x"); tk != (100-n)*bucket.Milli {
				t.Errorf("after Close the bucket holds %d millitokens, want %d", tk, (100-n)*bucket.Milli)
			}
		})
	}
}
