package rlqs

import (
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
)

// aheadWindow is how far ahead (ms) a take of one slot also pays for
// the renewals of the bucket's other slots on this replica. While
// Envoys start, or while the bucket is short, each renews every half
// second or less: three or four Envoys of a bucket on one replica then
// wrote the shared bucket three or four times a second, and the
// replicas' writes met (on DynamoDB, a lost race is billed as a write).
// One take for all of them writes once: 0.77 to 0.87 billed DynamoDB
// writes per assignment sent over 20 s, against 1.03 to 1.08 before
// (rlqs/writes_test.go). The take's own renewal is paid first and the
// others get what is left, so a short bucket gives no renewal less than
// it would have had alone. Once steady, renewals come every several
// seconds and a second ahead finds few: tokens are never held more
// than a second before the renewal they pay for.
const aheadWindow = 1000

// aheadStale is how long (ms) past its due a renewal still counts as
// coming: a slot that has not renewed by then has gone (its stream
// ended, its bucket was abandoned) and is forgotten.
const aheadStale = 30_000

// ahead books, for each shared bucket, the renewals its slots on this
// replica will make next: when, and how many tokens the last one asked
// the shared bucket for. A take pays for those due soon (claim), and
// the tokens wait in the replica's spares, from which those renewals are
// paid first. Safe for concurrent use.
type ahead struct {
	mu     sync.Mutex
	booked *lru.Cache[string, map[*slot]coming]
}

// coming is one slot's next renewal: due (ms) and what it will likely
// ask the shared bucket for.
type coming struct {
	due  int64
	need uint64
}

// newAhead bounds the buckets it books to size.
func newAhead(size int) *ahead {
	booked, _ := lru.New[string, map[*slot]coming](size) // a positive size never fails
	return &ahead{booked: booked}
}

// book records s's next renewal of key's bucket: due at due, asking
// need. A need of zero forgets it.
func (a *ahead) book(key string, s *slot, due int64, need uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.booked.Peek(key)
	if !ok {
		if need == 0 {
			return
		}
		m = map[*slot]coming{}
		a.booked.Add(key, m)
	}
	if need == 0 {
		delete(m, s)
		return
	}
	m[s] = coming{due: due, need: need}
}

// claim is what the renewals of key's other slots due after now and
// within aheadWindow will ask for, and takes them off the book: a take
// pays for them now, and no other take pays for them again.
func (a *ahead) claim(key string, s *slot, now int64) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.booked.Peek(key)
	if !ok {
		return 0
	}
	var n uint64
	for o, c := range m {
		switch {
		case c.due < now-aheadStale:
			delete(m, o)
		case o != s && c.due > now && c.due <= now+aheadWindow:
			n += c.need
			delete(m, o)
		}
	}
	return n
}
