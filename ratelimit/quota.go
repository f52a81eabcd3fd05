package ratelimit

// quotaTally decides a request's overall code from its descriptors'
// codes, as envoyproxy/ratelimit does since quota mode (quota_mode on a
// rule, or QUOTA_MODE for all): a descriptor in quota mode that is over
// its limit does not fail the request by itself. The request is over its
// limit when some descriptor not in quota mode is, or when every
// descriptor in quota mode is (a caller whose every quota is spent has
// nowhere left to go; while one quota has room, it passes, and the
// descriptors' own codes tell which are spent). Unlimited descriptors
// count as neither, and so do those no limit decided (unmatched,
// replaced, at a node without limits) unless every descriptor is in
// quota mode. Each descriptor keeps its own code.
type quotaTally struct {
	overNormal, quota, overQuota int
	// passed lists the limited descriptors not over their limit, in
	// request order: those whose rules' metadata the
	// response's dynamic metadata carries. Kept only when keepPassed:
	// without dynamic metadata it would cost every call an allocation.
	passed     []int
	keepPassed bool
}

// count records descriptor i, over its limit or not, in quota mode or not,
// decided by a limit or not.
func (q *quotaTally) count(i int, over, quota, limited bool) {
	switch {
	case over && quota:
		q.overQuota++
	case over:
		q.overNormal++
	case q.keepPassed && limited:
		q.passed = append(q.passed, i)
	}
	if quota {
		q.quota++
	}
}

// over reports whether the request is over its limit.
func (q *quotaTally) over() bool {
	return q.overNormal > 0 || (q.quota > 0 && q.overQuota == q.quota)
}
