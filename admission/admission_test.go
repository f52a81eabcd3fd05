package admission

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		limits Limits
		want   string // "" for valid
	}{
		{Limits{MaxInFlight: 1}, ""},
		{Limits{MaxInFlight: 1000, MaxQueued: 1000}, ""},
		{Limits{MaxInFlight: 0}, "in flight"},
		{Limits{MaxInFlight: -3, MaxQueued: 5}, "in flight"},
		{Limits{MaxInFlight: 4, MaxQueued: -1}, "queued"},
	} {
		_, err := New(c.limits)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.limits, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one about %q", c.limits, err, c.want)
		}
	}
}

// queue starts a call that must wait, and returns once it waits; the
// call's Acquire result arrives on the channel.
func queue(t *testing.T, c *Controller, ctx context.Context) <-chan error {
	t.Helper()
	before := c.Stats().Queued
	done := make(chan error, 1)
	go func() { done <- c.Acquire(ctx) }()
	waitFor(t, func() bool { return c.Stats().Queued == before+1 }, "the call to queue")
	return done
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// What the next call gets, given the limits and the calls already
// running and waiting.
func TestAcquireAnswer(t *testing.T) {
	for _, c := range []struct {
		name             string
		limits           Limits
		running, waiting int
		want             codes.Code // OK: admitted at once; Unknown: queued
		msg              string
	}{
		{"a free slot", Limits{MaxInFlight: 2}, 1, 0, codes.OK, ""},
		{"no slot, no queue", Limits{MaxInFlight: 2}, 2, 0, codes.ResourceExhausted, "overloaded: 2 in flight and 0 queued, the most allowed"},
		{"no slot, room in the queue", Limits{MaxInFlight: 2, MaxQueued: 2}, 2, 1, codes.Unknown, ""},
		{"no slot, queue full", Limits{MaxInFlight: 2, MaxQueued: 2}, 2, 2, codes.ResourceExhausted, "overloaded: 2 in flight and 2 queued, the most allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl, err := New(c.limits)
			if err != nil {
				t.Fatal(err)
			}
			for range c.running {
				if err := ctl.Acquire(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			for range c.waiting {
				queue(t, ctl, ctx)
			}
			if c.want == codes.Unknown {
				done := queue(t, ctl, ctx)
				select {
				case err := <-done:
					t.Fatalf("a call that should wait returned %v", err)
				case <-time.After(10 * time.Millisecond):
				}
				return
			}
			start := time.Now()
			err = ctl.Acquire(ctx)
			if status.Code(err) != c.want || (c.msg != "" && status.Convert(err).Message() != c.msg) {
				t.Fatalf("Acquire: %v, want %v %q", err, c.want, c.msg)
			}
			if took := time.Since(start); took > 100*time.Millisecond {
				t.Errorf("answering took %v: a refusal must not wait", took)
			}
			if c.want == codes.ResourceExhausted && ctl.Stats().ShedQueueFull != 1 {
				t.Errorf("stats: %+v, want one call shed for a full queue", ctl.Stats())
			}
		})
	}
}

// A queued call whose context ends leaves the queue at once with its
// context's status, and is counted; its place is not kept.
func TestQueuedCallGivesUp(t *testing.T) {
	for _, c := range []struct {
		name string
		ctx  func(context.Context) (context.Context, context.CancelFunc)
		want codes.Code
	}{
		{"deadline", func(p context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(p, 20*time.Millisecond)
		}, codes.DeadlineExceeded},
		{"canceled", context.WithCancel, codes.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl, _ := New(Limits{MaxInFlight: 1, MaxQueued: 1})
			if err := ctl.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := c.ctx(t.Context())
			defer cancel()
			done := queue(t, ctl, ctx)
			start := time.Now()
			if c.want == codes.Canceled {
				cancel()
			}
			select {
			case err := <-done:
				if status.Code(err) != c.want {
					t.Fatalf("Acquire: %v, want %v", err, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the queued call did not return when its context ended")
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("the queued call returned %v after its context could end", took)
			}
			st := ctl.Stats()
			if st.Queued != 0 || st.InFlight != 1 || st.ShedDeadline != 1 || st.ShedQueueFull != 0 {
				t.Errorf("stats after: %+v", st)
			}
			// Its place is not kept: the holder's release frees the slot
			// for the next caller.
			ctl.Release()
			if err := ctl.Acquire(t.Context()); err != nil {
				t.Fatalf("after the release: %v", err)
			}
		})
	}
}

// Slots go to waiting calls in the order they came, skipping those that
// gave up, and a newcomer never takes a slot from a waiting call.
func TestFIFO(t *testing.T) {
	ctl, _ := New(Limits{MaxInFlight: 1, MaxQueued: 4})
	if err := ctl.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	var waits []<-chan error
	var cancels []context.CancelFunc
	for range 4 {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cancels = append(cancels, cancel)
		waits = append(waits, queue(t, ctl, ctx))
	}
	cancels[1]() // the second gives up
	if err := <-waits[1]; status.Code(err) != codes.Canceled {
		t.Fatalf("the canceled call: %v", err)
	}
	for _, i := range []int{0, 2, 3} {
		ctl.Release()
		select {
		case err := <-waits[i]:
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("call %d did not get the freed slot", i)
		}
		for j := i + 1; j < len(waits); j++ {
			select {
			case err := <-waits[j]:
				t.Fatalf("call %d overtook call %d (%v)", j, i, err)
			default:
			}
		}
		// While calls wait, a newcomer queues behind them (here until
		// its deadline) rather than taking the next slot.
		if i == 0 {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
			err := ctl.Acquire(ctx)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("a newcomer while calls wait: %v, want it queued until its deadline", err)
			}
		}
	}
	ctl.Release()
	if st := ctl.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("stats at the end: %+v", st)
	}
}

func TestReleaseWithoutAcquirePanics(t *testing.T) {
	ctl, _ := New(Limits{MaxInFlight: 1})
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	ctl.Release()
}

// Many callers with random holds and random deadlines: never more than
// MaxInFlight run, never more than MaxQueued wait, a call waits only while
// every slot is taken, every call is either run or answered with the
// documented codes, and nothing is left held at the end.
func TestConcurrentInvariants(t *testing.T) {
	const inFlight, queued, callers, rounds = 3, 8, 24, 60
	ctl, _ := New(Limits{MaxInFlight: inFlight, MaxQueued: queued})
	var running, ran, full, gaveUp atomic.Int64
	var wrong atomic.Value
	stop := make(chan struct{})
	sampled := make(chan int)
	go func() { // watches the snapshot while the calls run
		n := 0
		for {
			select {
			case <-stop:
				sampled <- n
				return
			default:
			}
			st := ctl.Stats()
			n++
			if st.InFlight > inFlight || st.Queued > queued || (st.Queued > 0 && st.InFlight != inFlight) {
				wrong.Store(st)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range rounds {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch r.IntN(3) {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(2000))*time.Microsecond)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(time.Duration(r.IntN(2000))*time.Microsecond, cancel)
				}
				err := ctl.Acquire(ctx)
				switch status.Code(err) {
				case codes.OK:
					if n := running.Add(1); n > inFlight {
						t.Errorf("%d calls running at once, at most %d allowed", n, inFlight)
					}
					time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
					running.Add(-1)
					ran.Add(1)
					ctl.Release()
				case codes.ResourceExhausted:
					full.Add(1)
				case codes.DeadlineExceeded, codes.Canceled:
					gaveUp.Add(1)
				default:
					t.Errorf("Acquire: %v", err)
				}
				cancel()
				time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	close(stop)
	samples := <-sampled
	if st := wrong.Load(); st != nil {
		t.Errorf("a snapshot broke the limits: %+v", st)
	}
	st := ctl.Stats()
	t.Logf("%d calls: %d ran, %d refused (queue full), %d gave up waiting; %d snapshots", callers*rounds, ran.Load(), full.Load(), gaveUp.Load(), samples)
	if st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("slots leaked: %+v", st)
	}
	if ran.Load()+full.Load()+gaveUp.Load() != callers*rounds ||
		st.ShedQueueFull != uint64(full.Load()) || st.ShedDeadline != uint64(gaveUp.Load()) {
		t.Errorf("stats %+v, callers saw %d refused and %d giving up", st, full.Load(), gaveUp.Load())
	}
	if ran.Load() == 0 || full.Load() == 0 || gaveUp.Load() == 0 {
		t.Errorf("the load did not exercise every path: %d ran, %d refused, %d gave up", ran.Load(), full.Load(), gaveUp.Load())
	}
	// Every slot is free again.
	for range inFlight {
		if err := ctl.Acquire(context.Background()); err != nil {
			t.Fatalf("a slot leaked: %v", err)
		}
	}
}

// The interceptor limits the methods it names and nothing else: with
// every slot and the queue taken, a health check still runs.
func TestInterceptorLimitsOnlyNamedMethods(t *testing.T) {
	const limited = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	ctl, _ := New(Limits{MaxInFlight: 1})
	intercept := ctl.UnaryServerInterceptor(limited)
	inside := make(chan struct{})
	release := make(chan struct{})
	go intercept(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: limited}, func(context.Context, any) (any, error) {
		close(inside)
		<-release
		return "done", nil
	})
	<-inside
	ran := false
	handler := func(context.Context, any) (any, error) { ran = true; return "ok", nil }
	if _, err := intercept(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: limited}, handler); status.Code(err) != codes.ResourceExhausted || ran {
		t.Fatalf("a limited call over the limit: %v (ran: %v)", err, ran)
	}
	if resp, err := intercept(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}, handler); err != nil || resp != "ok" {
		t.Fatalf("a health check over the limit: %v, %v", resp, err)
	}
	close(release)
	waitFor(t, func() bool { return ctl.Stats().InFlight == 0 }, "the slot to be released")
	ran = false
	if _, err := intercept(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: limited}, handler); err != nil || !ran {
		t.Fatalf("a limited call under the limit: %v (ran: %v)", err, ran)
	}
}
