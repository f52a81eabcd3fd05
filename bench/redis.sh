#!/usr/bin/env bash
# redis.sh: the Redis runs of BENCHMARKS.md ("Redis backend"), one after
# the other, each side by side with its baselines.
#
# 1. Compare mode, in process (bin/sluice-bench -redis): a do-nothing
#    server, Sluice on the memory backend and Sluice on the Redis backend
#    (a redis-server sluice-bench starts), in alternating order, ROUNDS
#    rounds of DURATION each, for each compare load and each Redis delay
#    (REDIS_DELAYS: 0, then 500us, a fair in-region round trip, put
#    in front of Redis by a proxy). The records go to COMPARE_OUT.
# 2. The fleet (bench/matrix.sh): three replicas of sluice serve on one
#    redis-server of fleet.sh's own, with and without coalescing, and one
#    memory replica, for each fleet load. The records go to FLEET_OUT.
#
# bench/summarize.py prints the tables of either file again. Both parts
# take about 12 minutes on two cores; PARTS="compare" or PARTS="fleet"
# runs one.
#
# Environment: PARTS, ROUNDS (5), DURATION (compare mode, 3s),
# REDIS_DELAYS ("0 500us"), COMPARE_LOADS ("uniform zipf hot
# hot-no-coalescing"), FLEET_LOADS ("uniform zipf hot at-limit"),
# FLEET_CONFIGS ("redis redis-no-coalescing memory-1"), COMPARE_OUT,
# FLEET_OUT (bench/results/redis-{compare,fleet}-<time>.jsonl),
# FLEET_DURATION (10s), and REDIS_DELAY and WARMUP, which matrix.sh takes
# for the fleet.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null || { echo "redis.sh: redis-server not found (apt-get install redis-server)" >&2; exit 1; }

stamp=$(date -u +%Y%m%dT%H%M%SZ)
parts=${PARTS:-compare fleet}
compare_out=${COMPARE_OUT:-bench/results/redis-compare-$stamp.jsonl}
fleet_out=${FLEET_OUT:-bench/results/redis-fleet-$stamp.jsonl}
rounds=${ROUNDS:-5}
duration=${DURATION:-3s}
delays=${REDIS_DELAYS:-0 500us}
mkdir -p bench/results

# The compare loads: sluice-bench flags on top of compare mode's own
# (64 callers over 4 connections, 500ms warmup). "hot" is one key, as in
# the fleet's hot load; hot-no-coalescing is the same with the Redis
# backend deciding each call in a script run of its own.
declare -A compare_args=(
	[uniform]="-keys 300 -dist uniform"
	[zipf]="-keys 300 -dist zipf"
	[hot]=""
	[hot-no-coalescing]="-redis-coalesce=false"
)

for part in $parts; do
	case $part in
	compare)
		make --no-print-directory build >&2
		for load in ${COMPARE_LOADS:-uniform zipf hot hot-no-coalescing}; do
			for delay in $delays; do
				echo "redis.sh: compare, $load, Redis delay $delay" >&2
				# shellcheck disable=SC2086 # the argument lists are word lists
				bin/sluice-bench -redis -redis-delay "$delay" -rounds "$rounds" -duration "$duration" ${compare_args[$load]} -json |
					python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), load=sys.argv[1], redis_delay=sys.argv[2]))) for l in sys.stdin if l.strip()]' \
						"$load" "$delay" >>"$compare_out"
			done
		done
		echo "redis.sh: compare results in $compare_out" >&2
		python3 bench/summarize.py "$compare_out"
		;;
	fleet)
		OUT=$fleet_out LOADS=${FLEET_LOADS:-uniform zipf hot at-limit} \
			CONFIGS=${FLEET_CONFIGS:-redis redis-no-coalescing memory-1} \
			DURATION=${FLEET_DURATION:-10s} bench/matrix.sh
		;;
	*)
		echo "redis.sh: PARTS: unknown part $part (want compare, fleet)" >&2
		exit 2
		;;
	esac
done
