#!/usr/bin/env python3
"""What the slowest requests of a bench/peers.sh run had in common, from its per-request records
(.run/peers/requests-CONFIG-WORKLOAD-REPEAT.jsonl, written by kvroute-load --requests-out) and, for kvroute,
its gateway's routing decisions (.run/peers/router-kvroute-POLICY-WORKLOAD-REPEAT.log).

    python3 bench/tails.py chat                 # every configuration of the last run
    python3 bench/tails.py agent --top 4 --dir .run/peers

Per configuration, over every repeat's requests pooled: TTFT p50/p90/p99, the prompt tokens the engine had
to compute (prompt less cached: "uncached"), and the requests in flight when each was sent. Then its slowest
requests, each with its uncached tokens and what was in flight; for kvroute also the replica it was sent to,
the TTFT the router predicted for it there, and the requests in flight on that replica. Last, every pair of
configurations compared request by request (the same session and turn of the same repeat, sent at the same
moment of the run): how often and by how much one's TTFT was above the other's, and whether the requests it
lost on computed more tokens.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decisions  # noqa: E402  (the decision-log parser)

def load(directory, workload):
    """{config: {repeat: [record]}} for the workload's runs, records sorted by sending time."""
    runs = {}
    pattern = re.compile(r"requests-(.+)-" + re.escape(workload) + r"-(\d+)\.jsonl$")
    for path in sorted(glob.glob(os.path.join(directory, f"requests-*-{workload}-*.jsonl"))):
        match = pattern.search(os.path.basename(path))
        if not match:
            continue
        config, repeat = match.group(1), int(match.group(2))
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        records.sort(key=lambda r: r["sent_at"])
        runs.setdefault(config, {})[repeat] = records
    return runs


def in_flight(records, record):
    """How many other requests of the run were unfinished when `record` was sent."""
    t = record["sent_at"]
    return sum(1 for r in records if r is not record and r["sent_at"] <= t < r["sent_at"] + r["total"])


def routed(directory, config, workload, repeat, records):
    """kvroute only: {request: (replica, predicted ms)} from the run's decision log, matched in sending order
    by prompt length (the gateway logs the token count the engine reports back)."""
    log = os.path.join(directory, f"router-{config}-{workload}-{repeat}.log")
    if not config.startswith("kvroute") or not os.path.exists(log):
        return {}
    made = []
    with open(log, errors="replace") as f:
        for line in f:
            match = decisions.LINE.search(line)
            if not match or match.group(3) == "None":
                continue
            replica, tokens = int(match.group(3)), int(match.group(4))
            predicted = decisions.candidates(match.group(5)).get(replica, (0, 0, 0, float("nan")))[3]
            made.append((tokens, replica, predicted))
    out, used = {}, set()
    for record in records:
        for i, (tokens, replica, predicted) in enumerate(made):
            if i not in used and tokens == record["prompt_tokens"]:
                used.add(i)
                out[record["request"]] = (replica, predicted)
                break
    return out


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def uncached(record):
    return record["prompt_tokens"] - record["cached_tokens"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    parser.add_argument("--dir", default=".run/peers")
    parser.add_argument("--top", type=int, default=3, help="slowest requests shown per configuration")
    args = parser.parse_args()
    runs = load(args.dir, args.workload)
    if not runs:
        sys.exit(f"no requests-*-{args.workload}-*.jsonl in {args.dir}")

    print(f"{args.workload}: TTFT in ms over every repeat's requests pooled; uncached: prompt tokens the engine "
          f"computed; in flight: the fleet's unfinished requests when one was sent")
    print(f"  {'configuration':<26} {'n':>4} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6} {'uncached mean':>13} "
          f"{'p90+ uncached':>13} {'in flight mean':>14} {'p90+ in flight':>14}")
    for config, repeats in runs.items():
        ok = [(r, records) for records in repeats.values() for r in records if r.get("ttft") is not None]
        if not ok:
            failed = sum(len(records) for records in repeats.values())
            print(f"  {config:<26} {0:>4}  (none of {failed} requests succeeded)")
            continue
        ttfts = [r["ttft"] * 1e3 for r, _ in ok]
        cut = pct(ttfts, 0.9)
        slow = [(r, records) for r, records in ok if r["ttft"] * 1e3 >= cut]
        print(f"  {config:<26} {len(ok):>4} {pct(ttfts, 0.5):>6.0f} {cut:>6.0f} {pct(ttfts, 0.99):>6.0f} "
              f"{max(ttfts):>6.0f} {statistics.mean(uncached(r) for r, _ in ok):>13.0f} "
              f"{statistics.mean(uncached(r) for r, _ in slow):>13.0f} "
              f"{statistics.mean(in_flight(records, r) for r, records in ok):>14.1f} "
              f"{statistics.mean(in_flight(records, r) for r, records in slow):>14.1f}")

    print(f"\nthe {args.top} slowest requests of each configuration:")
    for config, repeats in runs.items():
        rows = []
        for repeat, records in repeats.items():
            where = routed(args.dir, config, args.workload, repeat, records)
            for r in records:
                if r.get("ttft") is None:
                    continue
                extra = ""
                if r["request"] in where:
                    replica, predicted = where[r["request"]]
                    there = sum(1 for o in records if o is not r and where.get(o["request"], (None,))[0] == replica
                                and o["sent_at"] <= r["sent_at"] < o["sent_at"] + o["total"])
                    extra = f", to replica {replica} (predicted {predicted:.0f} ms, {there} in flight there)"
                rows.append((r["ttft"], f"repeat {repeat} {r['request']} at {r['sent_at']:.1f} s: TTFT "
                             f"{r['ttft'] * 1e3:.0f} ms, {r['prompt_tokens']} prompt tokens, {uncached(r)} "
                             f"uncached, {in_flight(records, r)} in flight{extra}"))
        rows.sort(reverse=True)
        print(f"  {config}")
        for _, text in rows[: args.top]:
            print(f"    {text}")

    print("\nrequest by request (same repeat, session and turn): row slower than column in how many of the pairs; "
          "in brackets, of those, how many computed more uncached tokens than the column's")
    keyed = {c: {(rep, r["request"]): r for rep, recs in reps.items() for r in recs if r.get("ttft") is not None}
             for c, reps in runs.items()}
    names = list(runs)
    short = [n.replace("vllm-router", "vr").replace("sglang-router", "sg").replace("kvroute", "kv")
             .replace("cache_aware", "ca").replace("round_robin", "rr").replace("kv_aware", "kva") for n in names]
    print(f"  {'':<26} " + " ".join(f"{s:>13}" for s in short))
    for a in names:
        cells = []
        for b in names:
            common = keyed[a].keys() & keyed[b].keys()
            if a == b or not common:
                cells.append(f"{'-':>13}")
                continue
            lost = [k for k in common if keyed[a][k]["ttft"] > keyed[b][k]["ttft"]]
            more = sum(1 for k in lost if uncached(keyed[a][k]) > uncached(keyed[b][k]))
            cells.append(f"{len(lost):>4}/{len(common):<3} ({more:>3})")
        print(f"  {a:<26} " + " ".join(cells))


if __name__ == "__main__":
    main()
