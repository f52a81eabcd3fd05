// Package admission bounds the work a gRPC server takes on, so that load
// beyond what it can serve is refused at once instead of making every call
// slower.
//
// The model: at most MaxInFlight calls run at once. A call that arrives
// when all of them are taken waits in a first-in, first-out queue of at
// most MaxQueued calls; each call that finishes hands its slot straight to
// the call at the head of the queue, so a newcomer never overtakes a call
// that waited. A call that finds the queue full is refused immediately
// with gRPC RESOURCE_EXHAUSTED. A waiting call whose context ends (its
// deadline passes, or the client gives up) leaves the queue at once and
// returns its context's status, DEADLINE_EXCEEDED or CANCELED: that is
// what the client sees anyway, since gRPC clients enforce their own
// deadlines.
//
// Latency is therefore bounded: a call admitted waits behind at most
// MaxQueued others, which drain MaxInFlight at a time. Whatever arrives
// beyond that is shed in microseconds, without touching the backend.
//
// Only the methods named to UnaryServerInterceptor are limited: health
// checks and reflection must answer however loaded the server is, or an
// overloaded replica would be taken for a dead one.
package admission

import (
	"container/list"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits bound the calls a Controller admits.
type Limits struct {
	// MaxInFlight is how many calls run at once; at least 1.
	MaxInFlight int
	// MaxQueued is how many more calls may wait for a slot; 0: none wait,
	// a call that finds every slot taken is refused at once.
	MaxQueued int
}

// Validate reports limits that cannot work.
func (l Limits) Validate() error {
	if l.MaxInFlight < 1 {
		return fmt.Errorf("at most %d calls in flight: want at least 1", l.MaxInFlight)
	}
	if l.MaxQueued < 0 {
		return fmt.Errorf("at most %d calls queued: want 0 (no queue) or more", l.MaxQueued)
	}
	return nil
}

// Reasons a call is shed, as Stats counts them.
const (
	// ReasonQueueFull: every slot was taken and the queue was full; the
	// call was refused with RESOURCE_EXHAUSTED.
	ReasonQueueFull = "queue_full"
	// ReasonDeadline: the call's context ended while it waited in the
	// queue; it returned DEADLINE_EXCEEDED or CANCELED.
	ReasonDeadline = "deadline"
)

// Stats is a snapshot of a Controller.
type Stats struct {
	Limits
	// InFlight and Queued are the calls running and waiting now.
	InFlight, Queued int
	// ShedQueueFull and ShedDeadline count the calls shed since start,
	// by reason (ReasonQueueFull, ReasonDeadline).
	ShedQueueFull, ShedDeadline uint64
}

// Controller admits calls within its Limits. It is safe for concurrent
// use.
type Controller struct {
	limits Limits

	mu sync.Mutex
	// running is the slots taken. While the queue holds a call, every
	// slot is taken: a slot that frees goes to the queue's head.
	running int
	queue   list.List // of *waiter, oldest first

	shedFull, shedDeadline atomic.Uint64
}

// waiter is a queued call. ready is closed, and granted set, when a
// finishing call hands it its slot.
type waiter struct {
	ready   chan struct{}
	granted bool // under Controller.mu
}

// New returns a Controller that admits calls within l.
func New(l Limits) (*Controller, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &Controller{limits: l}, nil
}

// Acquire takes a slot for one call, waiting in the queue if every slot
// is taken. It returns nil once the call may run, and the call must then
// Release the slot when it is done. Otherwise it returns a gRPC status
// error: RESOURCE_EXHAUSTED at once when the queue is full, or the
// context's status (DEADLINE_EXCEEDED, CANCELED) when ctx ends while the
// call waits.
func (c *Controller) Acquire(ctx context.Context) error {
	c.mu.Lock()
	if c.running < c.limits.MaxInFlight { // so the queue is empty
		c.running++
		c.mu.Unlock()
		return nil
	}
	if c.queue.Len() >= c.limits.MaxQueued {
		running, queued := c.running, c.queue.Len()
		c.mu.Unlock()
		c.shedFull.Add(1)
		return status.Errorf(codes.ResourceExhausted, "overloaded: %d in flight and %d queued, the most allowed", running, queued)
	}
	w := &waiter{ready: make(chan struct{})}
	elem := c.queue.PushBack(w)
	c.mu.Unlock()

	select {
	case <-w.ready:
		if ctx.Err() == nil {
			return nil
		}
		// The slot came as the caller gave up: running the call would
		// only spend the backend on an answer nobody reads.
		c.Release()
	case <-ctx.Done():
		c.mu.Lock()
		granted := w.granted
		if !granted {
			c.queue.Remove(elem)
		}
		c.mu.Unlock()
		if granted { // the slot came while ctx ended: pass it on
			c.Release()
		}
	}
	c.shedDeadline.Add(1)
	st := status.FromContextError(ctx.Err())
	return status.Errorf(st.Code(), "gave up waiting for a slot: %v", ctx.Err())
}

// Release frees the slot of a call Acquire admitted, handing it to the
// oldest waiting call, if any.
func (c *Controller) Release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if front := c.queue.Front(); front != nil {
		w := c.queue.Remove(front).(*waiter)
		w.granted = true
		close(w.ready)
		return
	}
	if c.running == 0 {
		panic("admission: Release without Acquire")
	}
	c.running--
}

// Stats returns what the Controller holds now and has shed so far.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	running, queued := c.running, c.queue.Len()
	c.mu.Unlock()
	return Stats{Limits: c.limits, InFlight: running, Queued: queued,
		ShedQueueFull: c.shedFull.Load(), ShedDeadline: c.shedDeadline.Load()}
}

// UnaryServerInterceptor admits calls of the given full method names
// ("/package.Service/Method") through c before they run; calls of every
// other method pass untouched. Put it first in the chain, so that a shed
// call costs nothing beyond its decoding.
func (c *Controller) UnaryServerInterceptor(fullMethods ...string) grpc.UnaryServerInterceptor {
	methods := slices.Clone(fullMethods)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !slices.Contains(methods, info.FullMethod) {
			return handler(ctx, req)
		}
		if err := c.Acquire(ctx); err != nil {
			return nil, err
		}
		defer c.Release()
		return handler(ctx, req)
	}
}
