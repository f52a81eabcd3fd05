#!/usr/bin/env python3
"""Print the markdown table of a matrix.sh results file (JSON lines)."""
import json
import sys


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| load | serve | decisions/s | p50 | p99 | p999 | OK | over | errors | DynamoDB calls/decision | "
          "writes/allowed | RCU/decision | WCU/decision | local answers/denial | coalesced share | retries |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r.get("metrics") or {}
        print("| {} | {} | {:.0f} | {:.1f} ms | {:.1f} ms | {:.1f} ms | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["load"], r["serve"], r["decisions_per_second"],
            r["p50_us"] / 1000, r["p99_us"] / 1000, r["p999_us"] / 1000,
            r["ok"], r["over_limit"], r["errors"],
            fmt(m.get("dynamodb_calls_per_decision"), ".4f"),
            fmt(m.get("writes_per_allowed_decision"), ".4f"),
            fmt(m.get("rcu_per_decision"), ".4f"),
            fmt(m.get("wcu_per_decision"), ".4f"),
            fmt(m.get("local_denial_share"), ".4f"),
            fmt(m.get("coalesced_share"), ".4f"),
            fmt(m.get("condition_retries"), ".0f")))
    for r in rows:
        if r["load"] != "at-limit":
            continue
        # bench_hot: burst 2000, 2000/s. The run starts with the bucket
        # full and unmeasured calls only took tokens, so what the run
        # admits is bounded by burst + rate x elapsed (+1 for rounding).
        bound = 2000 + 2000 * r["elapsed_seconds"] + 1
        print(f"\n{r['serve']} at-limit: admitted {r['ok']} in {r['elapsed_seconds']:.3f} s; "
              f"bound B + R*T + 1 = {bound:.0f}; admitted/bound = {r['ok'] / bound:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
