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
        series_tables(rows)
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
    series_tables(rows)


# The keys of bench/rules/bench.yaml with a finite limit: burst B and
# rate R per second.
LIMITS = {"bench_hot": (2000, 2000), "bench_far": (500, 500)}


def limited_key(r):
    """The rules key of a run's descriptor when it has a finite limit."""
    desc = (r.get("config") or {}).get("descriptor") or []
    key = desc[0].split("=", 1)[0] if desc else None
    if key in LIMITS:
        return key
    # Records from before the descriptor was in them: at-limit was bench_hot.
    return "bench_hot" if r["load"].startswith("at-limit") else None


def at_limit(rows, replicas=False):
    """Admitted calls against the bound of a key at its limit. The bucket
    is new at its first call (the connection probe touches no bucket), so
    from then to the run's last answer it admits at most B + R*T + 1 (+1
    for rounding). With -prime the first calls are the priming ones: T
    runs from when they were sent (lead_seconds before the run) and what
    they were admitted counts. Memory replicas share nothing: each has
    its own bucket, and the bound is one per replica."""
    for r in rows:
        key = limited_key(r)
        if key is None:
            continue
        burst, rate = LIMITS[key]
        prime = r.get("prime") or {}
        t = r["elapsed_seconds"] + prime.get("lead_seconds", 0)
        admitted = r["ok"] + prime.get("ok", 0)
        buckets = r.get("replicas", 1) if backend(r) == "memory" else 1
        bound = (burst + rate * t + 1) * buckets
        who = f"{r['serve']} ({r.get('replicas', 'n/a')} replica(s))" if replicas else r["serve"]
        past = r.get("past_deadline")
        if past is None:
            past = (r.get("errors_by_code") or {}).get("DeadlineExceeded", 0)
        primed = f" (the run's {r['ok']} and {prime.get('ok', 0)} of the {prime['calls']} priming calls)" if prime else ""
        since = f", from the priming calls {prime['lead_seconds']:.3f} s before the run" if prime else ""
        shared = f"; {buckets} buckets (memory replicas share nothing)" if buckets > 1 else ""
        slow = ((r.get("metrics") or {}).get("answered_slower_than") or {}).get("50ms")
        handled = f" ({slow:.0f} handled in over 50 ms by the replicas)" if slow is not None else ""
        print(f"\n{r['load']}, {who}: admitted {admitted}{primed} in T = {t:.3f} s{since}, "
              f"{r['errors']} errors, {past} past the deadline{handled}; "
              f"bound B + R*T + 1 = {bound:.0f} ({key}: B {burst}, R {rate}/s){shared}; admitted/bound = {admitted / bound:.3f}")
        if prime:
            # The run's own span starts after the priming calls took their
            # leases: the bound holds over it too when leases out count
            # against the burst.
            span = (burst + rate * r["elapsed_seconds"] + 1) * buckets
            print(f"  the run's own span ({r['elapsed_seconds']:.3f} s, after the priming): admitted {r['ok']}, "
                  f"B + R*T + 1 = {span:.0f}; admitted/bound = {r['ok'] / span:.3f}")


BLOCK = 4.0  # seconds: the blocks the series targets are stated over


def window_writes(r, w):
    """A window's writes: DynamoDB's, or on Redis its round trips."""
    if backend(r) == "redis":
        return w.get("backend_calls")
    return w.get("writes")


def span_rates(r, ws):
    """Decisions/s and writes/s over windows ws, by their length."""
    span = sum(w["end"] - w["start"] for w in ws)
    if span <= 0:
        return None, None
    writes = [window_writes(r, w) for w in ws]
    per_s = None if any(x is None for x in writes) else sum(writes) / span
    return sum(w["ok"] + w["over_limit"] for w in ws) / span, per_s


def series_tables(rows):
    """Each run's windows (sluice-bench -series) in blocks of 4 s from its
    first call: decisions/s (answered calls) and writes/s (DynamoDB's
    UpdateItem + PutItem + TransactWriteItems, from the replicas'
    /metrics at each window's ends; on Redis, its round trips), errors
    and calls past their deadline. Then, per run: the first 4 s against
    seconds 12-16, and the most writes/s over any 4 s of consecutive
    windows."""
    rows = [r for r in rows if r.get("series")]
    if not rows:
        return
    print()
    writes = "writes/s (Redis: round trips/s)" if any(backend(r) == "redis" for r in rows) else "writes/s"
    print(f"| load | serve | backend | seconds | decisions/s | {writes} | errors | past deadline | p99 (worst window) |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    notes = []
    for r in rows:
        blocks = {}
        for w in r["series"]:
            blocks.setdefault(int(w["start"] // BLOCK + 1e-9), []).append(w)
        for b, ws in sorted(blocks.items()):
            dps, wps = span_rates(r, ws)
            print("| {} | {} | {} | {:.0f}-{:.0f} | {} | {} | {} | {} | {:.1f} ms |".format(
                r["load"], r["serve"], backend(r), ws[0]["start"], ws[-1]["end"], fmt(dps, ".0f"), fmt(wps, ".1f"),
                sum(w["errors"] for w in ws), sum(w["past_deadline"] for w in ws), max(w["p99_us"] for w in ws) / 1000))
        first, late = blocks.get(0), blocks.get(3)
        worst = None
        ws = r["series"]
        for i in range(len(ws)):
            for j in range(i, len(ws)):
                if ws[j]["end"] - ws[i]["start"] >= BLOCK - 1e-6:
                    _, wps = span_rates(r, ws[i:j + 1])
                    if wps is not None and (worst is None or wps > worst[0]):
                        worst = (wps, ws[i]["start"], ws[j]["end"])
                    break
        def block(ws):
            if not ws:
                return "n/a", None
            d, w = span_rates(r, ws)
            return (f"seconds {ws[0]['start']:.0f}-{ws[-1]['end']:.0f}: {fmt(d, '.0f')} decisions/s, "
                    f"{fmt(w, '.1f')} writes/s"), d
        text0, d0 = block(first)
        text3, d3 = block(late)
        ratio = d3 / d0 if d0 and d3 is not None else None
        most = f"{worst[0]:.1f} (seconds {worst[1]:.0f}-{worst[2]:.0f})" if worst else "n/a (not 4 s of windows with metrics)"
        notes.append(f"{r['load']}, {r['serve']}: first block {text0}; fourth block {text3}; "
                     f"decisions/s fourth over first: {fmt(ratio, '.2f')}; most writes/s over 4 s: {most}")
    for n in notes:
        print("\n" + n)


if __name__ == "__main__":
    main(sys.argv[1])
