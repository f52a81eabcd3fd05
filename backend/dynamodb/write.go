package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// op is one planned write: a whole item (create, rewrite) or an update
// (incremental), with its condition.
type op struct {
	put  map[string]types.AttributeValue // whole item, or nil
	key  map[string]types.AttributeValue // for an update
	e    *expr
	next *bucketItem // what the item holds after the write, if alone
}

// write persists the planned targets: one conditional write for one
// bucket, one transaction for a cascade. On a lost race every target
// holds what the table returned and errLostRace is returned.
func (b *Backend) write(ctx context.Context, ts []target, now int64) error {
	ops := make([]op, len(ts))
	for i := range ts {
		ops[i] = b.plannedOp(&ts[i], now)
	}
	if len(ts) == 1 {
		return b.writeOne(ctx, &ts[0], ops[0])
	}
	return b.writeTx(ctx, ts, ops)
}

// plannedOp turns t's plan into a conditional write.
//
// The incremental write is the steady state. Each limit is written in one
// of three forms, whichever fits what its decision did; every form keeps
// concurrent writers from losing each other's consumption, and none lets
// a stale view lift a bucket past its burst (pitfalls 1 and 8).
//
// Tokens out on lease count against the burst (bucket.State.Out): each
// limit keeps the tokens it holds (tk), what leases hold (ot, the sum of
// its slots: a window and its tokens each) and the room left for refill
// (rm = burst - tk - ot). Every write keeps the three adding up, with ADD
// where it can, so that each condition compares one attribute with a
// value, as DynamoDB's conditions can (they add nothing up). A write
// frees the slots whose window expired, conditioned on their exact
// content; a report on this replica's lease takes its tokens out of the
// slot of its window, conditioned on the window being the same (not
// freed); a lease is added to the slot of its window, conditioned on the
// slot being free or that window's.
//
// A paying write takes what it takes (net of what a folded lease gave
// back) from the tokens the limit holds and, when they fall short, from
// the fewest whole steps of its pending refill (bucket.Claim): it ADDs
// the claimed time to the clock and the difference to the tokens and to
// the room, on the condition that, whatever other writers did meanwhile,
// the clock is no earlier than the one this writer saw and at least the
// claimed time before now, that the tokens pay, and that the room holds
// the whole of the refill pending: refill is exact in whole steps, so
// what stays pending is credited later exactly as if now, and the
// condition guarantees no cap is reached, so nothing is back-dated. Such
// writes commute: replicas taking from one limit, even one at its limit
// that lives off its refill, claim disjoint slices of refill time
// instead of invalidating each other.
//
// A full write is for a limit that is full at now: its clock must move to
// now (time spent full is never credited), and it then holds the room
// less what the write takes: it SETs the tokens to the burst less that
// less what is out (read from the item as it is: tk = :v - ot) and the
// room to what the write leaves of it, on the condition that the item's
// state is one of those full at now: its room is at most k and its clock
// at least the time to refill k before now, for a few k around what this
// writer saw (bucket.FillTime). Another replica's write on a hot bucket
// far below its limit leaves such a state, so replicas do not invalidate
// each other there either.
//
// A refund is a refilling write: it moves the clock to where the refill
// left it and ADDs the difference in tokens (and its opposite to the
// room), on the condition that the clock is still the one the refill
// started from and that tokens and room stay at or above zero. A writer
// whose clock has moved on recomputes.
func (b *Backend) plannedOp(t *target, now int64) op {
	e := newExpr()
	nowSec := now / 1000
	ttl := b.ttlSeconds(t.res, now)
	if t.mode == unseen {
		return b.unseenOp(t, e, now, ttl)
	}
	if t.mode == incremental && overLent(t) {
		// Leases out beyond a lowered burst: no room to write within,
		// and a state only a whole item describes until they come back.
		t.mode = rewrite
	}
	if t.mode != incremental {
		item := &bucketItem{cfg: t.fp, ttl: ttl, limits: t.res.Limits, states: t.states}
		av := b.itemKey(t.key)
		av[attrEntity] = str(t.key.entity)
		av[attrResource] = str(t.key.resource)
		av[attrGSI2PK] = str(b.keys.GSI2PK(t.key.resource))
		av[attrGSI2SK] = str(GSI2SK(t.key.entity))
		av[attrCfg] = str(t.fp)
		if ttl != 0 {
			av[attrTTL] = num(ttl)
		}
		for i, l := range t.res.Limits {
			s := t.states[i]
			av[limitAttr(bucketPrefix, l.Name, fieldTokens)] = num(s.Tokens)
			av[limitAttr(bucketPrefix, l.Name, fieldCapacity)] = num(l.Amount)
			av[limitAttr(bucketPrefix, l.Name, fieldBurst)] = num(l.Burst)
			av[limitAttr(bucketPrefix, l.Name, fieldAmount)] = num(l.Amount)
			av[limitAttr(bucketPrefix, l.Name, fieldPeriod)] = num(l.Period)
			if l.Debt != 0 {
				av[limitAttr(bucketPrefix, l.Name, fieldDebt)] = num(max(l.Debt, bucket.NoDebt))
			}
			if l.IsBudget() {
				av[limitAttr(bucketPrefix, l.Name, fieldCalendar)] = str(l.CalendarKey())
			}
			av[limitAttr(bucketPrefix, l.Name, fieldConsumed)] = num(s.Consumed)
			av[limitAttr(bucketPrefix, l.Name, fieldClock)] = num(s.Clock)
			av[limitAttr(bucketPrefix, l.Name, fieldOut)] = num(s.Leased())
			av[limitAttr(bucketPrefix, l.Name, fieldRoom)] = num(l.Burst - s.Tokens - s.Leased())
			if since := bucket.AtRoom(l, s); since != 0 {
				av[limitAttr(bucketPrefix, l.Name, fieldAtRoom)] = num(since)
			}
			for k, o := range s.Out {
				if o.Window != 0 {
					w, ot := slotFields(k)
					av[limitAttr(bucketPrefix, l.Name, w)] = num(o.Window)
					av[limitAttr(bucketPrefix, l.Name, ot)] = num(o.Tokens)
				}
			}
		}
		if t.mode == create {
			// Nothing there, or only an item whose ttl has passed.
			e.when("attribute_not_exists(%n) OR %n <= %v", []string{attrPK, attrTTL}, []types.AttributeValue{num(nowSec)})
		} else {
			// Exactly the item the rewrite was computed from, leases
			// included.
			old := t.item
			e.when("%n = %v", []string{attrCfg}, []types.AttributeValue{str(old.cfg)})
			for i, l := range old.limits {
				e.when("%n = %v AND %n = %v",
					[]string{limitAttr(bucketPrefix, l.Name, fieldTokens), limitAttr(bucketPrefix, l.Name, fieldClock)},
					[]types.AttributeValue{num(old.states[i].Tokens), num(old.states[i].Clock)})
				sameLeases(e, l, old.states[i], old.legacy)
			}
			notExpired(e, nowSec)
		}
		return op{put: av, e: e, next: item}
	}

	if ttl != 0 {
		e.setAttr(attrTTL, num(ttl))
	} else {
		e.removeAttr(attrTTL)
	}
	e.when("%n = %v", []string{attrCfg}, []types.AttributeValue{str(t.fp)})
	notExpired(e, nowSec)
	// written is what the item holds after the write if nobody else wrote:
	// what a transaction, which returns nothing, leaves as the last state
	// seen.
	written := make([]bucket.State, len(t.res.Limits))
	for i, l := range t.res.Limits {
		base, next := t.base[i], t.states[i]
		written[i] = next
		tk := limitAttr(bucketPrefix, l.Name, fieldTokens)
		rf := limitAttr(bucketPrefix, l.Name, fieldClock)
		ot := limitAttr(bucketPrefix, l.Name, fieldOut)
		rm := limitAttr(bucketPrefix, l.Name, fieldRoom)
		cost := next.Consumed - base.Consumed
		refilled := bucket.Refill(l, base, now)
		// net: what the write takes from the tokens, less what a folded
		// lease gave back; dOut: what it adds to the leases out.
		net := refilled.Tokens - next.Tokens
		dOut := next.Leased() - base.Leased()
		if !t.refund && net == 0 && cost == 0 && next.Out == base.Out {
			// Neither taken from nor given to (a lease renewed for
			// another limit of the bucket): left as it is, unconditioned.
			written[i] = base
			continue
		}
		if cost > 0 {
			e.addAttr(limitAttr(bucketPrefix, l.Name, fieldConsumed), num(cost))
		}
		slotOps(e, l, base, next, t.freedOf(i))
		atRoomOps(e, l, base, next, at(t.since, i), at(t.credit, i), t.rep.First, now)
		if dOut != 0 {
			e.addAttr(ot, num(dOut))
		}
		low := t.lowest(l, next, net)
		switch {
		case !t.refund && refilled.Tokens >= bucket.Room(l, base) && !l.IsBudget():
			e.setMinus(tk, num(l.Burst-net), ot)
			e.setAttr(rm, num(net-dOut))
			e.setAttr(rf, num(now))
			e.when("%n <= %v", []string{ot}, []types.AttributeValue{num(l.Burst - net - low)})
			fullAt(e, l, rm, rf, base, net, now)
			written[i].Clock = now
		case !t.refund:
			// Pay from the tokens held and, if short, from the least whole
			// steps of refill; the rest stays pending on the clock. A write
			// claims only the refill it needs to stay at or above its
			// lowest: what pays for admissions (lowest zero), all of it for
			// charges beside them that go into debt, and for charges alone
			// only what their floor asks. Those then leave the clock to the
			// writers that admit, and do not lose race after race to them
			// on a bucket at its limit (claiming the refill, such a charge
			// took 11 writes and 2 s on a busy machine).
			want := min(max(net+low, 0), refilled.Tokens)
			ms, claimed := bucket.Claim(l, base, want)
			pending := refilled.Tokens - base.Tokens - claimed
			dTk := claimed - net
			written[i].Tokens, written[i].Clock = base.Tokens+dTk, base.Clock+ms
			if ms > 0 {
				e.addAttr(rf, num(ms))
			}
			if dTk != 0 {
				e.addAttr(tk, num(dTk))
			}
			if d := -(dTk + dOut); d != 0 {
				e.addAttr(rm, num(d))
			}
			if l.IsBudget() {
				// Nothing refills within a budget's period, so nothing
				// can be back-dated: the room need only take what the
				// write adds (plan rewrites a state of an earlier
				// period, whose clock this condition then rules out).
				e.when("%n BETWEEN %v AND %v AND %n >= %v AND %n >= %v", []string{rf, tk, rm}, []types.AttributeValue{
					num(base.Clock), num(now), num(net + low), num(max(dTk+dOut, 0))})
				break
			}
			e.when("%n BETWEEN %v AND %v AND %n >= %v AND %n >= %v", []string{rf, tk, rm}, []types.AttributeValue{
				num(base.Clock), num(now - ms), num(net - claimed + low), num(claimed + pending + 1)})
		default:
			delta := next.Tokens - base.Tokens
			if next.Clock != base.Clock {
				e.setAttr(rf, num(next.Clock))
			}
			if delta != 0 {
				e.addAttr(tk, num(delta))
				e.addAttr(rm, num(-delta))
			}
			e.when("%n = %v AND %n >= %v AND %n >= %v", []string{rf, tk, rm},
				[]types.AttributeValue{num(base.Clock), num(-delta), num(delta)})
		}
	}
	return op{key: b.itemKey(t.key), e: e, next: &bucketItem{cfg: t.fp, ttl: ttl, limits: t.res.Limits, states: written}}
}

// lowest is the fewest tokens t's write may leave limit l with, whose
// planned state after it is next and which takes net of its tokens,
// whatever others wrote meanwhile: zero for decisions (what they
// admitted was there), the limit's floor for a write of charges alone
// (they land whatever is left), and for both together below zero, next
// itself (the item still holds all it held when the admissions among
// them were decided). A write that takes none of the limit's tokens (a
// report, a return, a renewal that grants none of it) leaves it no
// lower than the item holds, so it may leave it as low as planned: held
// to zero, every such write on a limit in debt lost its race, and a
// lease there was never renewed nor given back.
func (t *target) lowest(l bucket.Limit, next bucket.State, net int64) int64 {
	low := min(next.Tokens, 0)
	switch {
	case !t.charged:
		low = 0
	case !t.admitted:
		low = bucket.Bottom(l, next)
	}
	if net <= 0 {
		low = min(low, next.Tokens)
	}
	return low
}

// atRoomOps keeps limit l's time at its room (fieldAtRoom, from base to
// next): removed by a write that leaves the limit below its room, set
// by one that leaves it there if the item does not have it. A write
// whose report is credited the refill that stood still at the room
// (credit, bucket.Return, from the lease's first spend or the time the
// bucket reached its room, since, whichever is later) moves that time
// past what it credits, on the condition that the item's state allows
// it whatever others wrote since the view: a time at or before first
// (the credit ran from first); a later one from which the credited time
// has passed by now (another report moved it on since the view: what is
// left still covers it); or, with no time in the item, a state that was
// full by since (refill from its clock reaches its room by then, as
// fullAt states for now). Two reports are never credited the same time.
func atRoomOps(e *expr, l bucket.Limit, base, next bucket.State, since, credit, first, now int64) {
	fs := limitAttr(bucketPrefix, l.Name, fieldAtRoom)
	next.AtRoomSince = bucket.AtRoom(l, next)
	if credit <= 0 {
		switch {
		case next.AtRoomSince == 0:
			e.removeAttr(fs)
		case base.AtRoomSince == 0:
			e.setIfAbsent(fs, num(next.AtRoomSince))
		}
		return
	}
	d := bucket.FillTime(l, credit)
	from := max(since, first)
	switch {
	case base.AtRoomSince == 0:
		e.when("attribute_not_exists(%n)", []string{fs}, nil)
		fullAt(e, l, limitAttr(bucketPrefix, l.Name, fieldRoom), limitAttr(bucketPrefix, l.Name, fieldClock), base, 0, from)
		if next.AtRoomSince != 0 {
			e.setAttr(fs, num(from+d))
		}
	case since <= first:
		e.when("%n <= %v", []string{fs}, []types.AttributeValue{num(first)})
		if next.AtRoomSince != 0 {
			e.setAttr(fs, num(first+d))
		}
	default:
		e.when("%n BETWEEN %v AND %v", []string{fs}, []types.AttributeValue{num(first), num(now - d)})
		if next.AtRoomSince != 0 {
			e.addAttr(fs, num(d))
		}
	}
	if next.AtRoomSince == 0 {
		e.removeAttr(fs)
	}
}

// overLent reports whether some limit of t's item has more out on lease
// than its burst (the burst was lowered while they were out).
func overLent(t *target) bool {
	for i, l := range t.res.Limits {
		if t.base[i].Leased() > l.Burst {
			return true
		}
	}
	return false
}

// freedOf is what t's write frees of limit i's slots.
func (t *target) freedOf(i int) [bucket.LeaseSlots]bool {
	if i < len(t.freed) {
		return t.freed[i]
	}
	return [bucket.LeaseSlots]bool{}
}

// slotOps writes what changed in limit l's lease slots from base to
// next: a slot freed (its window expired: conditioned on its exact
// content, and emptied or opened to the window lent into it), a report
// or a lease in a live window (ADD to its tokens, conditioned on the
// window, and on its tokens covering what the report takes out), or a
// window opened in a free slot (conditioned on the slot being free or
// already that window's, which other writers may be lending into).
func slotOps(e *expr, l bucket.Limit, base, next bucket.State, freed [bucket.LeaseSlots]bool) {
	for k := range bucket.LeaseSlots {
		b, n := base.Out[k], next.Out[k]
		if b == n {
			continue
		}
		wf, of := slotFields(k)
		w, o := limitAttr(bucketPrefix, l.Name, wf), limitAttr(bucketPrefix, l.Name, of)
		switch {
		case freed[k]:
			e.when("%n = %v AND %n = %v", []string{w, o}, []types.AttributeValue{num(b.Window), num(b.Tokens)})
			setSlot(e, l, k, n)
		case b.Window == n.Window:
			d := n.Tokens - b.Tokens
			e.addAttr(o, num(d))
			if d < 0 {
				e.when("%n = %v AND %n >= %v", []string{w, o}, []types.AttributeValue{num(b.Window), num(-d)})
			} else {
				e.when("%n = %v", []string{w}, []types.AttributeValue{num(b.Window)})
			}
		default: // a free slot, opened to n's window
			e.setAttr(w, num(n.Window))
			e.addAttr(o, num(n.Tokens))
			e.when("attribute_not_exists(%n) OR %n = %v", []string{w, w}, []types.AttributeValue{num(n.Window)})
		}
	}
}

// setSlot writes limit l's lease slot k as o: its window and tokens, or
// nothing for an empty slot.
func setSlot(e *expr, l bucket.Limit, k int, o bucket.Out) {
	wf, of := slotFields(k)
	w, ot := limitAttr(bucketPrefix, l.Name, wf), limitAttr(bucketPrefix, l.Name, of)
	if o.Window != 0 {
		e.setAttr(w, num(o.Window))
		e.setAttr(ot, num(o.Tokens))
		return
	}
	e.removeAttr(w)
	e.removeAttr(ot)
}

// sameLeases conditions a whole-item write on limit l's leases being as
// s (read from the item) has them: their sum and every slot's tokens.
func sameLeases(e *expr, l bucket.Limit, s bucket.State, legacy bool) {
	ot := limitAttr(bucketPrefix, l.Name, fieldOut)
	if legacy && s.Leased() == 0 {
		e.when("attribute_not_exists(%n) OR %n = %v", []string{ot, ot}, []types.AttributeValue{num(0)})
	} else {
		e.when("%n = %v", []string{ot}, []types.AttributeValue{num(s.Leased())})
	}
	for k, o := range s.Out {
		if o.Window == 0 {
			continue
		}
		_, of := slotFields(k)
		e.when("%n = %v", []string{limitAttr(bucketPrefix, l.Name, of)}, []types.AttributeValue{num(o.Tokens)})
	}
}

// unseenOp is a create that also succeeds on an item of the same limits
// that is full at now with no lease out: both leave the bucket full less
// what the decision took, with its clock at now. It SETs every attribute
// a create puts and ADDs to the consumed totals (which start at zero on a
// new item). An expired item of the same limits counts as absent; one of
// other limits, or with leases out, fails the condition, and the retry
// plans on the item it returns.
func (b *Backend) unseenOp(t *target, e *expr, now, ttl int64) op {
	e.setAttr(attrEntity, str(t.key.entity))
	e.setAttr(attrResource, str(t.key.resource))
	e.setAttr(attrGSI2PK, str(b.keys.GSI2PK(t.key.resource)))
	e.setAttr(attrGSI2SK, str(GSI2SK(t.key.entity)))
	e.setAttr(attrCfg, str(t.fp))
	if ttl != 0 {
		e.setAttr(attrTTL, num(ttl))
	} else {
		e.removeAttr(attrTTL)
	}
	mark := len(e.cond)
	for i, l := range t.res.Limits {
		s := t.states[i]
		tk := limitAttr(bucketPrefix, l.Name, fieldTokens)
		rf := limitAttr(bucketPrefix, l.Name, fieldClock)
		rm := limitAttr(bucketPrefix, l.Name, fieldRoom)
		e.setAttr(tk, num(s.Tokens))
		e.setAttr(rf, num(s.Clock))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldCapacity), num(l.Amount))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldBurst), num(l.Burst))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldAmount), num(l.Amount))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldPeriod), num(l.Period))
		if l.Debt != 0 {
			e.setAttr(limitAttr(bucketPrefix, l.Name, fieldDebt), num(max(l.Debt, bucket.NoDebt)))
		} else {
			e.removeAttr(limitAttr(bucketPrefix, l.Name, fieldDebt))
		}
		if l.IsBudget() {
			e.setAttr(limitAttr(bucketPrefix, l.Name, fieldCalendar), str(l.CalendarKey()))
		} else {
			e.removeAttr(limitAttr(bucketPrefix, l.Name, fieldCalendar))
		}
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldOut), num(s.Leased()))
		e.setAttr(rm, num(l.Burst-s.Tokens-s.Leased()))
		if fs, since := limitAttr(bucketPrefix, l.Name, fieldAtRoom), bucket.AtRoom(l, s); since != 0 {
			e.setAttr(fs, num(since))
		} else {
			e.removeAttr(fs)
		}
		for k, o := range s.Out {
			setSlot(e, l, k, o)
		}
		cost := s.Consumed - t.base[i].Consumed
		e.addAttr(limitAttr(bucketPrefix, l.Name, fieldConsumed), num(cost))
		fullAt(e, l, rm, rf, t.base[i], cost, now)
		ot := limitAttr(bucketPrefix, l.Name, fieldOut)
		e.when("%n = %v", []string{ot}, []types.AttributeValue{num(0)})
	}
	// Full at now with nothing out, every limit: the clauses added above,
	// under an OR.
	full := strings.Join(e.cond[mark:], " AND ")
	e.cond = e.cond[:mark]
	e.when("attribute_not_exists(%n) OR (%n = %v AND (%n <= %v OR "+full+"))",
		[]string{attrPK, attrCfg, attrTTL}, []types.AttributeValue{str(t.fp), num(now / 1000)})
	return op{key: b.itemKey(t.key), e: e, next: &bucketItem{cfg: t.fp, ttl: ttl, limits: t.res.Limits, states: slices.Clone(t.states)}}
}

// fullAt conditions a full write of limit l on an item state that is full
// at now: one of a few regions "rm <= k AND rf <= now-FillTime(k)" (room
// rm left to refill, clock rf). The first k holds the state this writer
// saw (base); the others, halving down from it and doubling up, hold the
// states another writer's recent write leaves (its cost taken, its clock
// a little later).
func fullAt(e *expr, l bucket.Limit, rm, rf string, base bucket.State, cost, now int64) {
	seen := max(bucket.Room(l, base)-base.Tokens, 0)
	ks := []int64{seen}
	from := max(seen, cost, 1)
	for k := from; k > 0 && len(ks) < 8; k /= 2 {
		ks = append(ks, k)
	}
	for k := from * 2; k <= l.Burst && len(ks) < 10; k *= 2 {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	ks = slices.Compact(ks)
	var clause strings.Builder
	var names []string
	var values []types.AttributeValue
	for _, k := range ks {
		fill := bucket.FillTime(l, k)
		if fill > now {
			continue
		}
		if clause.Len() > 0 {
			clause.WriteString(" OR ")
		}
		clause.WriteString("(%n <= %v AND %n <= %v)")
		names = append(names, rm, rf)
		values = append(values, num(k), num(now-fill))
	}
	e.when(clause.String(), names, values)
}

// notExpired conditions a write on an item whose ttl has not passed.
func notExpired(e *expr, nowSec int64) {
	e.when("attribute_not_exists(%n) OR %n > %v", []string{attrTTL, attrTTL}, []types.AttributeValue{num(nowSec)})
}

func (b *Backend) writeOne(ctx context.Context, t *target, o op) error {
	var err error
	start := time.Now()
	defer func() { observeWrite(&b.rtt, time.Since(start), err) }()
	if o.put != nil {
		var out *dynamodb.PutItemOutput
		out, err = b.api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                           aws.String(b.table),
			Item:                                o.put,
			ConditionExpression:                 o.e.condition(),
			ExpressionAttributeNames:            o.e.names,
			ExpressionAttributeValues:           o.e.valuesOrNil(),
			ReturnConsumedCapacity:              types.ReturnConsumedCapacityTotal,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		b.stats.call("PutItem", err)
		if err == nil {
			b.stats.consumedWrite(out.ConsumedCapacity)
			t.item, t.fresh = o.next, true
			b.seen.Add(t.key, seenItem{item: o.next, at: b.now()})
			return nil
		}
	} else {
		var out *dynamodb.UpdateItemOutput
		out, err = b.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                           aws.String(b.table),
			Key:                                 o.key,
			UpdateExpression:                    o.e.update(),
			ConditionExpression:                 o.e.condition(),
			ExpressionAttributeNames:            o.e.names,
			ExpressionAttributeValues:           o.e.valuesOrNil(),
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnConsumedCapacity:              types.ReturnConsumedCapacityTotal,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		b.stats.call("UpdateItem", err)
		if err == nil {
			b.stats.consumedWrite(out.ConsumedCapacity)
			return b.saw(t, out.Attributes)
		}
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		if err := b.saw(t, ccf.Item); err != nil {
			return err
		}
		return errLostRace{err}
	}
	return fmt.Errorf("writing bucket %q/%q: %w", t.key.entity, t.key.resource, err)
}

// writeTx charges a cascade's buckets in one transaction. Its
// cancellation reasons say, per item, whether a condition failed (the
// item is returned and the decision recomputed) or the transaction met
// another one (retried after a pause): neither means "over the limit"
// (pitfall 10).
func (b *Backend) writeTx(ctx context.Context, ts []target, ops []op) error {
	items := make([]types.TransactWriteItem, len(ops))
	for i, o := range ops {
		if o.put != nil {
			items[i].Put = &types.Put{
				TableName: aws.String(b.table), Item: o.put,
				ConditionExpression: o.e.condition(), ExpressionAttributeNames: o.e.names,
				ExpressionAttributeValues:           o.e.valuesOrNil(),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
		} else {
			items[i].Update = &types.Update{
				TableName: aws.String(b.table), Key: o.key, UpdateExpression: o.e.update(),
				ConditionExpression: o.e.condition(), ExpressionAttributeNames: o.e.names,
				ExpressionAttributeValues:           o.e.valuesOrNil(),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
		}
	}
	start := time.Now()
	out, err := b.api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: items, ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	observeWrite(&b.rtt, time.Since(start), err)
	b.stats.call("TransactWriteItems", err)
	if err == nil {
		b.stats.consumedWrite(each(out.ConsumedCapacity)...)
		for i := range ts {
			// A transaction returns no item: keep what the write left if
			// nobody else wrote. The next write's condition checks it.
			next := ops[i].next
			ts[i].item = next
			b.seen.Add(ts[i].key, seenItem{item: next, at: b.now()})
		}
		return nil
	}
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return fmt.Errorf("writing cascade %q/%q: %w", ts[0].key.entity, ts[0].key.resource, err)
	}
	lost := false
	for i, r := range tce.CancellationReasons {
		if i >= len(ts) {
			break
		}
		switch aws.ToString(r.Code) {
		case "None", "":
		case "ConditionalCheckFailed":
			if err := b.saw(&ts[i], r.Item); err != nil {
				return err
			}
			lost = true
		case "TransactionConflict":
			lost = true
		default:
			return fmt.Errorf("writing cascade %q/%q: %s: %w", ts[0].key.entity, ts[0].key.resource, aws.ToString(r.Code), err)
		}
	}
	if lost {
		return errLostRace{err}
	}
	return fmt.Errorf("writing cascade %q/%q: %w", ts[0].key.entity, ts[0].key.resource, err)
}
