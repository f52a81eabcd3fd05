package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/usage"
	"github.com/sluice-rl/sluice/regions"
)

// What a region's replicas were asked for its global keys in a slot
// (backend/usage) is a field per replica and chunk of a hash per slot
// and shard, {prefix}:u:{slot}:{shard}, the shard picked by the
// replica's id: a replica writes a few fields once a window, not one per
// key, and a sync reads a slot with usage.Shards HGETALLs. Each hash
// expires a few windows after its slot.
const (
	// usageChunk is the most JSON one field holds.
	usageChunk = 256 << 10
)

// Usage is the key of shard's usage hash of slot.
func (k Keys) Usage(slot regions.Slot, shard int) string {
	return k.base() + ":u:" + strconv.FormatInt(int64(slot), 10) + ":" + strconv.Itoa(shard)
}

// writeUsage writes this replica's sums of slot (backend.WriteUsage).
func (b *Backend) writeUsage(ctx context.Context, slot regions.Slot, counts map[regions.Key]int64) error {
	c := b.opts.Global.Clock()
	key := b.keys.Usage(slot, b.replica.Shard)
	cmds := rueidis.Commands{}
	for i, chunk := range usage.Encode(counts, usageChunk) {
		cmds = append(cmds, b.client.B().Hset().Key(key).FieldValue().FieldValue(b.replica.ID+"#"+strconv.Itoa(i), string(chunk)).Build())
	}
	// Relative, so that a replica's clock off the server's moves nothing.
	ttl := max(c.Start(slot)+4*c.Window-b.opts.Now(), c.Window)
	cmds = append(cmds, b.client.B().Pexpire().Key(key).Milliseconds(ttl).Build())
	return b.opts.round(ctx, "HSET", func(ctx context.Context) error {
		for _, r := range b.client.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Usage is what the region's replicas were asked for each global key in
// slot, in parts of its limit (regions.Asked), summed over the replicas
// whose sums were written: what a sync reads as the region's demand. A
// key no replica was asked for is not in it.
func (a *Admin) Usage(ctx context.Context, slot regions.Slot) (map[regions.Key]int64, error) {
	cmds := make(rueidis.Commands, usage.Shards)
	for shard := range usage.Shards {
		cmds[shard] = a.client.B().Hgetall().Key(a.keys.Usage(slot, shard)).Build()
	}
	counts := map[regions.Key]int64{}
	for _, r := range a.client.DoMulti(ctx, cmds...) {
		h, err := r.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("reading the usage of slot %d: %w", slot, err)
		}
		for _, chunk := range h {
			if err := usage.Decode([]byte(chunk), counts); err != nil {
				return nil, fmt.Errorf("reading the usage of slot %d: %w", slot, err)
			}
		}
	}
	return counts, nil
}

// Moving is what the replica keeps for global shares that move (its
// copies of the share records, its usage; Flush writes the usage of the
// windows that are over), nil when they do not.
func (b *Backend) Moving() *backend.Moving { return b.moving }
