#!/usr/bin/env bash
# matrix.sh: the DynamoDB runs of BENCHMARKS.md, side by side in one go.
#
# For each load (by default uniform, zipf, hot key, denied flood, hot key
# at its limit), it runs bench/fleet.sh once per serve configuration, one
# after the other (by default Sluice as it ships, then with write
# coalescing off, then with local denial off; also no-leases, and memory:
# the memory backend). Every run is a fresh DynamoDB Local and a fresh
# fleet of REPLICAS replicas (default 3; some loads set their own), so no
# run inherits another's buckets or caches. The lease targets of
# BENCHMARKS.md section 3:
#
#   DYNAMODB_DELAY=5ms LOADS="zipf-open zipf-48 hot-6 at-limit-600 warm-1" \
#     CONFIGS="shipped no-leases" bench/matrix.sh
#   LOADS=warm-1 CONFIGS=memory bench/matrix.sh
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
# to every DynamoDB call), REDIS_DELAY (the same for Redis, in the redis
# configurations), DURATION (default 10s), WARMUP (default 5s), LOADS and
# CONFIGS (space-separated names, to run a subset).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${DURATION:-10s}
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
)
# Replicas per load, where it is not REPLICAS (default 3).
declare -A load_replicas=(
	[hot-6]=6
	[warm-1]=1
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
		backend=dynamodb delay=${DYNAMODB_DELAY:-0} redis_delay=0
		case $config in
		memory*) backend=memory delay=0 ;;
		redis*) backend=redis delay=0 redis_delay=${REDIS_DELAY:-0} ;;
		esac
		echo "matrix.sh: $load, $config, $replicas replica(s)" >&2
		# shellcheck disable=SC2086 # the argument lists are word lists
		REPLICAS=$replicas BACKEND=$backend DYNAMODB_DELAY=$delay REDIS_DELAY=$redis_delay SERVE_ARGS="${config_args[$config]}" \
			bench/fleet.sh -domain bench -duration "$duration" -warmup "$warmup" ${load_args[$load]} -json |
			python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), load=sys.argv[1], serve=sys.argv[2], serve_args=sys.argv[3], replicas=int(sys.argv[4]), dynamodb_delay=sys.argv[5], backend=sys.argv[6], redis_delay=sys.argv[7]))) for l in sys.stdin if l.strip()]' \
				"$load" "$config" "${config_args[$config]}" "$replicas" "$delay" "$backend" "$redis_delay" >>"$out"
	done
done
echo "matrix.sh: results in $out" >&2
python3 bench/summarize.py "$out"
