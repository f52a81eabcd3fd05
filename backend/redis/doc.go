// Package redis keeps Sluice's token buckets in Redis, for teams that
// already run it (for envoyproxy/ratelimit, or because Envoy Gateway hands
// its rate-limit pod a REDIS_URL).
//
// Every limit of one entity+resource lives in one hash (ADR-114's layout:
// fields b_{limit}_{tk,cp,bx,ra,rp,tc,rf} and cfg), and each decision is
// one run of one server-side script (decide.lua), which Redis executes
// atomically: read, refill, decide and write with nothing in between, so
// any number of Sluice replicas share one truth in one round trip. The
// script does backend/bucket's arithmetic step for step; everything around
// it (costs, TTLs, waits, the limits' resolution) is the shared Go code.
package redis
