#!/usr/bin/env bash
# matrix.sh: the DynamoDB runs of BENCHMARKS.md, side by side in one go.
#
# For each load (by default uniform, zipf, hot key, denied flood, hot key
# at its limit), it runs bench/fleet.sh once per serve configuration, one
# after the other (by default Sluice as it ships, then with write
# coalescing off, then with local denial off; also no-leases, and memory:
# the memory backend; on Redis: redis, redis-no-coalescing, redis-no-leases). Every run is a fresh DynamoDB Local and a fresh
# fleet of REPLICAS replicas (default 3; some loads set their own), so no
# run inherits another's buckets or caches. The lease targets of
# BENCHMARKS.md section 3:
#
#   DYNAMODB_DELAY=5ms LOADS="zipf-open zipf-48 hot-6 at-limit-600 warm-1" \
#     CONFIGS="shipped no-leases" bench/matrix.sh
#   LOADS=warm-1 CONFIGS=memory bench/matrix.sh
#
# The loads of leases in the transients (issue 24, item 5): a key that
# turns hot from cold, a fleet that has just started, and the store 70 ms
# away. Each brings its own replicas, DynamoDB delay (5ms; 70ms for the
# far ones) and, for hot-cold-6, duration (16s, so that seconds 12-16 are
# measured); every one records its run in 1 s windows (-series 1s). Leases
# on and off and the memory backend, side by side in one file:
#
#   LOADS="hot-cold-6 zipf-start zipf-3000 far-zipf far-limit" \
#     CONFIGS="shipped no-leases memory" bench/matrix.sh
#
# and the same loads on one Redis 70 ms away (REDIS_DELAY applies to every
# load; the loads' DynamoDB delays do not):
#
#   REDIS_DELAY=70ms LOADS="hot-cold-6 zipf-start zipf-3000 far-zipf far-limit" \
#     CONFIGS="redis" bench/matrix.sh
#
# bench/summarize.py prints each run's windows in blocks of 4 s
# (decisions/s, writes/s) and far-limit's admitted calls against
# B + R*T + 1.
#
# The fleet runs of BENCHMARKS.md's Redis section (bench/redis.sh runs
# them): three replicas on one redis-server of fleet.sh's own, with and
# without coalescing, then one memory replica, for each load:
#
#   LOADS="uniform zipf hot at-limit" CONFIGS="redis redis-no-coalescing memory-1" \
#     bench/matrix.sh
#
# Each run's JSON goes to OUT (default bench/results/matrix-<time>.jsonl)
# with the load and configuration added, and the summary table is printed
# at the end (bench/summarize.py OUT prints it again).
#
# Environment: REPLICAS, DYNAMODB_DELAY (passed to fleet.sh: latency added
# to every DynamoDB call, for the loads without a delay of their own),
# REDIS_DELAY (the same for Redis, in the redis configurations, for every
# load), DURATION (default 10s, or the load's own; set, it is every
# load's), WARMUP (default 5s), LOADS and CONFIGS (space-separated names,
# to run a subset), OUT, SERIES (far-limit's window, default 1s: 100ms
# shows a storm's first second round trip by round trip).
set -euo pipefail
cd "$(dirname "$0")/.."

warmup=${WARMUP:-5s}
out=${OUT:-bench/results/matrix-$(date -u +%Y%m%dT%H%M%SZ).jsonl}
mkdir -p "$(dirname "$out")"

declare -A load_args=(
	[uniform]="-descriptor bench_key=u -keys 300 -dist uniform -concurrency 64 -warmup 15s"
	[zipf]="-descriptor bench_key=z -keys 300 -dist zipf -concurrency 64 -warmup 15s"
	[hot]="-descriptor bench_key=h -concurrency 200"
	[flood]="-descriptor bench_key=f -over-limit 1 -over-descriptor bench_over=flood -concurrency 64"
	[at-limit]="-descriptor bench_hot=a -concurrency 200 -warmup 0"
	# The loads of the lease targets (BENCHMARKS.md section 3). A lease
	# grows with the demand its replica has seen over a horizon (30 s),
	# so the many-key loads warm up for two horizons.
	[zipf-open]="-descriptor bench_key=z -keys 300 -dist zipf -rate 1000 -concurrency 64 -warmup 60s"
	[zipf-48]="-descriptor bench_key=z -keys 300 -dist zipf -concurrency 48 -warmup 60s"
	[hot-6]="-descriptor bench_key=h -concurrency 200"
	[at-limit-600]="-descriptor bench_hot=a -concurrency 600 -warmup 0"
	[warm-1]="-descriptor bench_key=w -concurrency 64"
	# The loads of leases in the transients (issue 24, item 5).
	# hot-cold-6: one key no replica has seen (-fresh: a value of the
	# run's own), 6 replicas x 10 callers from the first call on (no
	# warmup), 16 s: decisions/s and writes/s in the first 4 s against
	# seconds 12-16.
	[hot-cold-6]="-descriptor bench_key=hc -fresh -concurrency 60 -warmup 0 -series 1s"
	# zipf-start: zipf-open's paced load on a fleet that has just started,
	# measured from 4 s after the replicas are ready; zipf-3000 the same
	# on 3,000 keys from 30 s.
	[zipf-start]="-descriptor bench_key=z -keys 300 -dist zipf -rate 1000 -concurrency 64 -warmup 4s -series 1s"
	# zipf-start-warm: the same on a DynamoDB Local warmed first
	# (WARM_STORE, below), as a real table is while a fleet deploys.
	[zipf-start-warm]="-descriptor bench_key=z -keys 300 -dist zipf -rate 1000 -concurrency 64 -warmup 4s -series 1s"
	[zipf-3000]="-descriptor bench_key=z -keys 3000 -dist zipf -rate 1000 -concurrency 64 -warmup 30s -series 1s"
	# far-zipf: the same paced load with the store 70 ms away, from 30 s.
	[far-zipf]="-descriptor bench_key=z -keys 300 -dist zipf -rate 1000 -concurrency 64 -warmup 30s -series 1s"
	# far-limit: one key at its limit (bench_far: 500/s, burst 500) with
	# the store 70 ms away, after one call with no deadline to each
	# replica (-prime), 100 callers per replica, each call with Envoy's
	# kind of deadline (50 ms).
	[far-limit]="-descriptor bench_far=l -fresh -concurrency 300 -timeout 50ms -warmup 0 -prime -series ${SERIES:-1s}"
	# far-limit-warm: the same on a DynamoDB Local warmed first: a fresh
	# emulator's JVM spends over half a core compiling in its first
	# minute, on the cores the replicas and the callers share.
	[far-limit-warm]="-descriptor bench_far=l -fresh -concurrency 300 -timeout 50ms -warmup 0 -prime -series 1s"
	# far-limit-paced: the same key and deadlines, paced at 3,000 calls a
	# second (six times the limit) instead of as fast as 300 callers go:
	# the closed loop keeps two cores saturated at 18,000 calls a second,
	# so its calls past the deadline are partly the callers' own queueing;
	# paced, what is late is what the fleet made late. -warm: on a
	# DynamoDB Local warmed first.
	[far-limit-paced]="-descriptor bench_far=l -fresh -rate 3000 -concurrency 300 -timeout 50ms -warmup 0 -prime -series 1s"
	[far-limit-paced-warm]="-descriptor bench_far=l -fresh -rate 3000 -concurrency 300 -timeout 50ms -warmup 0 -prime -series 1s"
)
# Replicas per load, where it is not REPLICAS (default 3).
declare -A load_replicas=(
	[hot-6]=6
	[warm-1]=1
	[hot-cold-6]=6
	[zipf-start]=3
	[zipf-start-warm]=3
	[zipf-3000]=3
	[far-zipf]=3
	[far-limit]=3
	[far-limit-warm]=3
	[far-limit-paced]=3
	[far-limit-paced-warm]=3
)
# The DynamoDB delay of a load that has its own (DYNAMODB_DELAY is the
# others'): the distance is part of what it measures.
declare -A load_delay=(
	[hot-cold-6]=5ms
	[zipf-start]=5ms
	[zipf-start-warm]=5ms
	[zipf-3000]=5ms
	[far-zipf]=70ms
	[far-limit]=70ms
	[far-limit-warm]=70ms
	[far-limit-paced]=70ms
	[far-limit-paced-warm]=70ms
)
# How long the store is warmed before the fleet starts (fleet.sh's
# WARM_STORE), for the loads that measure a fleet's start on a store that
# is not itself starting.
declare -A load_warm=(
	[zipf-start-warm]=20s
	[far-limit-warm]=20s
	[far-limit-paced-warm]=20s
)
# The measured time of a load that needs its own, unless DURATION is set.
declare -A load_duration=(
	[hot-cold-6]=16s
)
declare -A config_args=(
	[shipped]=""
	[no-coalescing]="--coalesce-writes=false"
	[no-local-denial]="--deny-staleness 0"
	[no-leases]="--lease-horizon 0"
	[memory]=""
	[memory-1]=""
	[redis]=""
	[redis-no-coalescing]="--coalesce-writes=false"
	[redis-no-leases]="--lease-horizon 0"
)
# Replicas per configuration, where it is not the load's: memory replicas
# share nothing, so the fair comparison with a fleet is one of them.
declare -A config_replicas=(
	[memory-1]=1
)
loads=${LOADS:-uniform zipf hot flood at-limit}
configs=${CONFIGS:-shipped no-coalescing no-local-denial}

for load in $loads; do
	for config in $configs; do
		replicas=${config_replicas[$config]:-${load_replicas[$load]:-${REPLICAS:-3}}}
		duration=${DURATION:-${load_duration[$load]:-10s}}
		backend=dynamodb delay=${load_delay[$load]:-${DYNAMODB_DELAY:-0}} redis_delay=0
		case $config in
		memory*) backend=memory delay=0 ;;
		redis*) backend=redis delay=0 redis_delay=${REDIS_DELAY:-0} ;;
		esac
		echo "matrix.sh: $load, $config, $replicas replica(s), $duration" >&2
		# shellcheck disable=SC2086 # the argument lists are word lists
		REPLICAS=$replicas BACKEND=$backend DYNAMODB_DELAY=$delay REDIS_DELAY=$redis_delay SERVE_ARGS="${config_args[$config]}" \
			WARM_STORE=${load_warm[$load]:-} \
			bench/fleet.sh -domain bench -duration "$duration" -warmup "$warmup" ${load_args[$load]} -json |
			python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), load=sys.argv[1], serve=sys.argv[2], serve_args=sys.argv[3], replicas=int(sys.argv[4]), dynamodb_delay=sys.argv[5], backend=sys.argv[6], redis_delay=sys.argv[7]))) for l in sys.stdin if l.strip()]' \
				"$load" "$config" "${config_args[$config]}" "$replicas" "$delay" "$backend" "$redis_delay" >>"$out"
	done
done
echo "matrix.sh: results in $out" >&2
python3 bench/summarize.py "$out"
