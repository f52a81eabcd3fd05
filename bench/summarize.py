#!/usr/bin/env python3
"""Print the markdown tables of a matrix.sh or redis.sh results file (JSON lines)."""
import json
import sys

# DynamoDB on-demand write request units, us-east-1: dollars per million.
# A bucket item is under 1 KB, so each write is one unit, and a write whose
# condition fails is billed too: dollars go by writes, not by the units
# DynamoDB Local reports for the writes that succeeded.
DOLLARS_PER_MILLION_WRITES = 0.625


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def backend(r):
    """The backend a run decided on: matrix.sh's tag, else the metrics'."""
    return r.get("backend") or (r.get("metrics") or {}).get("backend") or "dynamodb"


def redis_table(rows):
    """The table of a file with Redis runs: round trips, not DynamoDB's
    calls and capacity, and the memory runs beside them."""
    print("| load | serve | backend | replicas | Redis delay | decisions/s | p50 | p99 | p999 | OK | over | errors | "
          "round trips/decision | EVALSHA/decision | HGETALL/decision | config cache misses |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r.get("metrics") or {}
        decisions = m.get("backend_decisions") or 0
        by_op = m.get("backend_calls_by_operation") or {}
        redis = backend(r) == "redis"

        def per(op):
            return by_op.get(op, 0) / decisions if redis and decisions else None
        print("| {} | {} | {} | {} | {} | {:.0f} | {:.2f} ms | {:.2f} ms | {:.2f} ms | {} | {} | {} | {} | {} | {} | {} |".format(
            r["load"], r["serve"], backend(r), r.get("replicas", "n/a"), r.get("redis_delay", "0") if redis else "",
            r["decisions_per_second"], r["p50_us"] / 1000, r["p99_us"] / 1000, r["p999_us"] / 1000,
            r["ok"], r["over_limit"], r["errors"],
            fmt(m.get("backend_calls_per_decision") if redis else None, ".4f"),
            fmt(per("EVALSHA"), ".4f"), fmt(per("HGETALL"), ".4f"),
            fmt(m.get("config_cache_misses") if redis else None, ".0f")))


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def compare_table(rows):
    """The table of a file of compare-mode runs (bench/redis.sh): per load
    and Redis delay, each server's medians over the rounds, and the
    ratios of median throughputs."""
    groups = {}
    for r in rows:
        groups.setdefault((r.get("load", "-"), r.get("redis_delay", "0")), []).append(r)
    print("| load | Redis delay | server | rounds | decisions/s (median) | p50 | p99 | round trips/decision |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    ratios = []
    for (load, delay), rs in groups.items():
        med = {}
        for server in ("noop", "memory", "redis"):
            runs = [r for r in rs if r["server"] == server]
            if not runs:
                continue
            med[server] = median([r["decisions_per_second"] for r in runs])
            trips = median([(r.get("metrics") or {}).get("backend_calls_per_decision") for r in runs])
            print("| {} | {} | {} | {} | {:.0f} | {:.2f} ms | {:.2f} ms | {} |".format(
                load, delay, server, len(runs), med[server],
                median([r["p50_us"] for r in runs]) / 1000, median([r["p99_us"] for r in runs]) / 1000,
                fmt(trips, ".4f")))

        def per_round(a, b):
            by = {}
            for r in rs:
                by.setdefault(r["round"], {})[r["server"]] = r["decisions_per_second"]
            return median([x[a] / x[b] for x in by.values() if a in x and b in x and x[b]])
        if "redis" in med:
            ratios.append((load, delay, med["memory"] / med["noop"], med["redis"] / med["memory"],
                           per_round("redis", "memory"), med["redis"] / med["noop"]))
    print()
    print("| load | Redis delay | memory/noop | redis/memory | redis/memory, median of rounds | redis/noop |")
    print("|---|---:|---:|---:|---:|---:|")
    for load, delay, mn, rm, rmr, rn in ratios:
        print(f"| {load} | {delay} | {mn:.3f} | {rm:.3f} | {fmt(rmr, '.3f')} | {rn:.3f} |")


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if rows and all((r.get("config") or {}).get("mode") == "compare" for r in rows):
        compare_table(rows)
        return
    if any(backend(r) == "redis" for r in rows):
        redis_table(rows)
        at_limit(rows, replicas=True)
        return
    print("| load | serve | replicas | DynamoDB delay | offered | decisions/s | p50 | p99 | p999 | OK | over | errors | "
          "late | dropped | DynamoDB calls/decision | writes/decision | writes/s | WCU/decision | $/M decisions | "
          "answered locally | lease writes | coalesced share | retries |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r.get("metrics") or {}
        c = r.get("config") or {}
        offered = f"{c['rate']:.0f}/s" if c.get("rate") else f"{c.get('concurrency')} callers"
        decisions = m.get("backend_decisions") or 0
        writes = m.get("dynamodb_writes")
        wpd = writes / decisions if writes is not None and decisions else None
        wcu = m.get("wcu_per_decision")
        dollars = wpd * DOLLARS_PER_MILLION_WRITES if wpd is not None else None
        local = m.get("local_answers")
        local_share = local / decisions if local is not None and decisions else None
        print("| {} | {} | {} | {} | {} | {:.0f} | {:.1f} ms | {:.1f} ms | {:.1f} ms | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["load"], r["serve"], r.get("replicas", "n/a"), r.get("dynamodb_delay", "0") or "0", offered,
            r["decisions_per_second"], r["p50_us"] / 1000, r["p99_us"] / 1000, r["p999_us"] / 1000,
            r["ok"], r["over_limit"], r["errors"], r.get("late", 0), r.get("dropped", 0),
            fmt(m.get("dynamodb_calls_per_decision"), ".4f"),
            fmt(wpd, ".4f"),
            fmt(writes / r["elapsed_seconds"] if writes is not None else None, ".1f"),
            fmt(wcu, ".4f"),
            fmt(dollars, ".3f"),
            fmt(local_share, ".3f"),
            fmt(m.get("lease_writes"), ".0f"),
            fmt(m.get("coalesced_share"), ".4f"),
            fmt(m.get("condition_retries"), ".0f")))
    at_limit(rows)


def at_limit(rows, replicas=False):
    for r in rows:
        if not r["load"].startswith("at-limit"):
            continue
        # bench_hot: burst 2000, 2000/s. The run starts with the bucket
        # full and unmeasured calls only took tokens, so what the run
        # admits is bounded by burst + rate x elapsed (+1 for rounding).
        bound = 2000 + 2000 * r["elapsed_seconds"] + 1
        who = f"{r['serve']} ({r.get('replicas', 'n/a')} replica(s))" if replicas else r["serve"]
        print(f"\n{r['load']}, {who}: admitted {r['ok']} in {r['elapsed_seconds']:.3f} s, {r['errors']} errors; "
              f"bound B + R*T + 1 = {bound:.0f}; admitted/bound = {r['ok'] / bound:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
