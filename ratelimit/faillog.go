package ratelimit

import (
	"sync"
	"time"
)

// logLimiter lets one line through per interval and counts the others, so
// that a backend failing every call cannot flood the logs.
type logLimiter struct {
	every time.Duration

	mu      sync.Mutex
	next    time.Time
	dropped int
}

// allow reports whether a line may be logged at now, and how many were
// held back since the last one that was.
func (l *logLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.dropped++
		return false, 0
	}
	l.next = now.Add(l.every)
	n := l.dropped
	l.dropped = 0
	return true, n
}
