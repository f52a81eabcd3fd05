package rlqs

import (
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
)

// spares holds, for each shared bucket, the tokens this replica's slots
// took from it and their Envoys can no longer use (slot.reclaim), given
// up while the bucket is contended (Policy.settle) for the bucket's
// other Envoys on this replica. The next take of any slot of the bucket
// is paid from them first, and asks the shared bucket only for the
// rest: a refund folded into the next take, instead of a write of its
// own (a refund and the take after it were two writes of the bucket
// for one assignment). Spare tokens left the shared bucket before they
// were taken into a slot's bank, so handing them to an Envoy keeps the
// bound; none is ever given back to the bucket, so none can lift it
// above its burst. Safe for concurrent use.
type spares struct {
	mu   sync.Mutex
	held *lru.Cache[string, uint64]
}

// newSpares bounds the buckets it holds spares for to size; lost is told
// of the tokens of a bucket pushed out, least recently used first.
func newSpares(size int, lost func(uint64)) *spares {
	held, _ := lru.NewWithEvict(size, func(_ string, n uint64) { lost(n) }) // a positive size never fails
	return &spares{held: held}
}

// give adds up to n tokens to key's spares, which hold at most most of
// them (a burst of the shared bucket: more than it could ever hold is
// more than its Envoys need at once), and returns how many it took.
func (s *spares) give(key string, n, most uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	have, _ := s.held.Peek(key)
	if have >= most {
		return 0
	}
	n = min(n, most-have)
	if n > 0 {
		s.held.Add(key, have+n)
	}
	return n
}

// draw takes up to n tokens from key's spares and returns how many.
func (s *spares) draw(key string, n uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	have, ok := s.held.Peek(key)
	if !ok || n == 0 {
		return 0
	}
	n = min(n, have)
	// Kept at zero rather than removed: a removal would tell lost of
	// the tokens.
	s.held.Add(key, have-n)
	return n
}

// spare is the spares of one shared bucket, as a renewal of one of its
// slots sees them.
type spare struct {
	of  *spares // nil: none (a renewal that neither draws nor gives)
	key string
}

func (s spare) give(n, most uint64) uint64 {
	if s.of == nil {
		return 0
	}
	return s.of.give(s.key, n, most)
}

func (s spare) draw(n uint64) uint64 {
	if s.of == nil {
		return 0
	}
	return s.of.draw(s.key, n)
}
