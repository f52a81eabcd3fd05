package lease

import "math"

// Rate estimates how fast tokens go, in millitokens per millisecond: an
// average of what was recorded, each amount weighted by how long ago it
// was, so that an amount recorded tau ago counts 1/e of one recorded now.
// tau is the caller's, given on every call, so a Rate holds only its
// estimate. The zero Rate has seen nothing and estimates 0.
type Rate struct {
	perMs float64
	at    int64 // when perMs was last brought up to date (ms); 0: never
	first int64 // when the first amount was recorded (ms); 0: never
}

// Add records n millitokens gone at now (epoch ms). A time before the
// last one recorded counts as the last: the estimate never runs back.
func (r *Rate) Add(n, now, tau int64) {
	r.perMs = r.At(now, tau)
	if now > r.at {
		r.at = now
	}
	if n > 0 && tau > 0 {
		if r.first == 0 {
			r.first = now
		}
		r.perMs += float64(n) / float64(tau)
	}
}

// Arriving is the estimate at now as demand arrives: At, less the bias
// of an average that started at zero when the first amount came. Soon
// after the first amount that is what came since, over the time since
// (but over at least window ms, so that a first burst is not read as an
// endless one); a tau after it, it is At. A key that turns hot is then
// seen at its new pace from its first calls, not a horizon later.
func (r Rate) Arriving(now, tau, window int64) float64 {
	v := r.At(now, tau)
	if r.first == 0 || tau <= 0 {
		return v
	}
	elapsed := max(now-r.first, window, 1)
	return v / -math.Expm1(-float64(elapsed)/float64(tau))
}

// At is the estimate at now: what was recorded, decayed to now.
func (r Rate) At(now, tau int64) float64 {
	if r.at == 0 || now <= r.at || tau <= 0 {
		return r.perMs
	}
	return r.perMs * math.Exp(-float64(now-r.at)/float64(tau))
}

// Counter turns readings of a running total that only grows (a bucket
// item's consumed counter, which every writer adds to) into a Rate: how
// fast the whole fleet takes tokens from the bucket. The zero Counter
// has read nothing.
type Counter struct {
	total int64
	at    int64 // when total was read (ms); 0: never
	rate  Rate
}

// Observe reads total at now. A total below the last one (the item was
// rebuilt or expired and created anew) starts the count again from it;
// a reading no later than the last, or the first, only sets the base.
func (c *Counter) Observe(total, now, tau int64) {
	if c.at == 0 || total < c.total {
		c.total, c.at = total, now
		return
	}
	if total == c.total || now <= c.at {
		if total > c.total {
			// Same instant, more taken: count it now rather than lose it.
			c.rate.Add(total-c.total, now, tau)
			c.total = total
		}
		return
	}
	c.rate.Add(total-c.total, now, tau)
	c.total, c.at = total, now
}

// At is the fleet's estimated rate at now, in millitokens per ms.
func (c Counter) At(now, tau int64) float64 { return c.rate.At(now, tau) }

// Arriving is At less the bias of its start, as Rate.Arriving.
func (c Counter) Arriving(now, tau, window int64) float64 { return c.rate.Arriving(now, tau, window) }
