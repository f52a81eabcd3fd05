#!/usr/bin/env python3
"""Print the markdown tables of a matrix.sh results file (JSON lines)."""
import json
import sys

# DynamoDB on-demand write request units, us-east-1: dollars per million.
# A bucket item is under 1 KB, so each write is one unit, and a write whose
# condition fails is billed too: dollars go by writes, not by the units
# DynamoDB Local reports for the writes that succeeded.
DOLLARS_PER_MILLION_WRITES = 0.625


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
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
    for r in rows:
        if not r["load"].startswith("at-limit"):
            continue
        # bench_hot: burst 2000, 2000/s. The run starts with the bucket
        # full and unmeasured calls only took tokens, so what the run
        # admits is bounded by burst + rate x elapsed (+1 for rounding).
        bound = 2000 + 2000 * r["elapsed_seconds"] + 1
        print(f"\n{r['load']}, {r['serve']}: admitted {r['ok']} in {r['elapsed_seconds']:.3f} s, {r['errors']} errors; "
              f"bound B + R*T + 1 = {bound:.0f}; admitted/bound = {r['ok'] / bound:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
