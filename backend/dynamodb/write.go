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
// A paying write takes the cost from the tokens the limit holds and, when
// they fall short, from the fewest whole steps of its pending refill
// (bucket.Claim): it ADDs the claimed time to the clock and the claimed
// tokens less the cost to the tokens, on the condition that, whatever
// other writers did meanwhile, the clock is no earlier than the one this
// writer saw and at least the claimed time before now, and that the tokens
// pay the cost and stay below the burst even with the refill still
// pending. Refill is exact in whole steps, so what stays pending is
// credited later exactly as if now; the condition guarantees no cap is
// reached, so nothing is back-dated. Such writes commute: replicas taking
// from one limit, even one at its limit that lives off its refill, claim
// disjoint slices of refill time instead of invalidating each other.
//
// A full write is for a limit that is full at now: its clock must move to
// now (time spent full is never credited), and it then holds the burst
// less the cost. That outcome is the same from every state that is full
// at now, so it SETs both, on the condition that the item's state is one
// of them: it holds at least burst-k and its clock is at least the time
// to refill k before now, for a few k around what this writer saw
// (bucket.FillTime). Another replica's write on a hot bucket far below its
// limit leaves such a state, so replicas do not invalidate each other
// there either.
//
// A refund, or a lease given back, is a refilling write: it moves the clock to where the refill
// left it and ADDs the difference in tokens, on the condition that the
// clock is still the one the refill started from and that the tokens stay
// within [0, burst] after the ADD. A writer whose clock has moved on
// recomputes.
func (b *Backend) plannedOp(t *target, now int64) op {
	e := newExpr()
	nowSec := now / 1000
	ttl := b.ttlSeconds(t.res, now)
	if t.mode == unseen {
		return b.unseenOp(t, e, now, ttl)
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
			av[limitAttr(bucketPrefix, l.Name, fieldConsumed)] = num(s.Consumed)
			av[limitAttr(bucketPrefix, l.Name, fieldClock)] = num(s.Clock)
		}
		if t.mode == create {
			// Nothing there, or only an item whose ttl has passed.
			e.when("attribute_not_exists(%n) OR %n <= %v", []string{attrPK, attrTTL}, []types.AttributeValue{num(nowSec)})
		} else {
			// Exactly the item the rewrite was computed from.
			old := t.item
			e.when("%n = %v", []string{attrCfg}, []types.AttributeValue{str(old.cfg)})
			for i, l := range old.limits {
				e.when("%n = %v AND %n = %v",
					[]string{limitAttr(bucketPrefix, l.Name, fieldTokens), limitAttr(bucketPrefix, l.Name, fieldClock)},
					[]types.AttributeValue{num(old.states[i].Tokens), num(old.states[i].Clock)})
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
		cost := next.Consumed - base.Consumed
		refilled := bucket.Refill(l, base, now)
		// back: tokens a folded lease gives back beyond what the
		// decision took.
		back := next.Tokens - refilled.Tokens
		if !t.refund && back == 0 && cost == 0 {
			// Neither taken from nor given to (a lease renewed for
			// another limit of the bucket): left as it is, unconditioned.
			written[i] = base
			continue
		}
		if cost > 0 {
			e.addAttr(limitAttr(bucketPrefix, l.Name, fieldConsumed), num(cost))
		}
		switch {
		case !t.refund && back <= 0 && refilled.Tokens >= l.Burst:
			e.setAttr(tk, num(next.Tokens))
			e.setAttr(rf, num(next.Clock))
			fullAt(e, l, tk, rf, base, cost, now)
		case !t.refund && back <= 0:
			// Pay from the tokens held and, if short, from the least whole
			// steps of refill; the rest stays pending on the clock.
			ms, claimed := bucket.Claim(l, base, cost)
			written[i] = bucket.State{Tokens: base.Tokens + claimed - cost, Clock: base.Clock + ms, Consumed: next.Consumed}
			pending := refilled.Tokens - base.Tokens - claimed
			if ms > 0 {
				e.addAttr(rf, num(ms))
			}
			if d := claimed - cost; d != 0 {
				e.addAttr(tk, num(d))
			}
			e.when("%n BETWEEN %v AND %v AND %n BETWEEN %v AND %v", []string{rf, tk}, []types.AttributeValue{
				num(base.Clock), num(now - ms), num(cost - claimed), num(l.Burst - pending - 1 - (claimed - cost))})
		default:
			delta := next.Tokens - base.Tokens
			if next.Clock != base.Clock {
				e.setAttr(rf, num(next.Clock))
			}
			if delta != 0 {
				e.addAttr(tk, num(delta))
			}
			e.when("%n = %v AND %n BETWEEN %v AND %v", []string{rf, tk},
				[]types.AttributeValue{num(base.Clock), num(-delta), num(l.Burst - delta)})
		}
	}
	return op{key: b.itemKey(t.key), e: e, next: &bucketItem{cfg: t.fp, ttl: ttl, limits: t.res.Limits, states: written}}
}

// unseenOp is a create that also succeeds on an item of the same limits
// that is full at now: both leave the bucket full less what the decision
// took, with its clock at now. It SETs every attribute a create puts and
// ADDs to the consumed totals (which start at zero on a new item). An
// expired item of the same limits counts as absent; one of other limits
// fails the condition, and the retry plans on the item it returns.
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
		e.setAttr(tk, num(s.Tokens))
		e.setAttr(rf, num(s.Clock))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldCapacity), num(l.Amount))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldBurst), num(l.Burst))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldAmount), num(l.Amount))
		e.setAttr(limitAttr(bucketPrefix, l.Name, fieldPeriod), num(l.Period))
		cost := s.Consumed - t.base[i].Consumed
		e.addAttr(limitAttr(bucketPrefix, l.Name, fieldConsumed), num(cost))
		fullAt(e, l, tk, rf, t.base[i], cost, now)
	}
	// Full at now, every limit: the clauses fullAt added, under an OR.
	full := strings.Join(e.cond[mark:], " AND ")
	e.cond = e.cond[:mark]
	e.when("attribute_not_exists(%n) OR (%n = %v AND (%n <= %v OR "+full+"))",
		[]string{attrPK, attrCfg, attrTTL}, []types.AttributeValue{str(t.fp), num(now / 1000)})
	return op{key: b.itemKey(t.key), e: e, next: &bucketItem{cfg: t.fp, ttl: ttl, limits: t.res.Limits, states: slices.Clone(t.states)}}
}

// fullAt conditions a full write of limit l on an item state that is full
// at now: one of a few regions "tk >= burst-k AND rf <= now-FillTime(k)".
// The first k holds the state this writer saw (base); the others, halving
// down from it and doubling up, hold the states another writer's recent
// write leaves (its cost taken, its clock a little later).
func fullAt(e *expr, l bucket.Limit, tk, rf string, base bucket.State, cost, now int64) {
	seen := max(l.Burst-base.Tokens, 0)
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
		clause.WriteString("(%n >= %v AND %n <= %v)")
		names = append(names, tk, rf)
		values = append(values, num(l.Burst-k), num(now-fill))
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
