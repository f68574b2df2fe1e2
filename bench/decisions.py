#!/usr/bin/env python3
"""Summarises kvroute gateways' routing-decision logs (RUST_LOG=kvroute::decision=debug; bench/peers.sh writes
them for kvroute's workload runs as .run/peers/router-kvroute-*-WORKLOAD-REPEAT.log).

    python3 bench/decisions.py .run/peers/router-kvroute-cache_aware-chat-*.log

For each log: decisions by rule; how many went to a replica holding fewer of the prompt's blocks than another
eligible one did ("gave up locality"), how many blocks that cost (GPU tier), and the predicted TTFTs of the
chosen and the most-cached replica at those decisions; and the requests each replica got.
"""

import re
import statistics
import sys
from collections import Counter

LINE = re.compile(r'routing decision policy="([^"]+)" rule="([^"]+)" chosen=(?:Some\()?(\d+|None)\)? '
                  r'prompt_tokens=(\d+) candidates=(\S+)')


def candidates(field):
    """replica -> (gpu, host, network blocks, predicted ttft ms, queue ms, score, excluded)."""
    out = {}
    for part in field.split(";"):
        replica, rest = part.split(":", 1)
        values = rest.split(",")
        gpu, host, network = (int(x) for x in values[0].split("/"))
        out[int(replica)] = (gpu, host, network, float(values[1]), float(values[2]), float(values[3]),
                             values[4] if len(values) > 4 else None)
    return out


def summarise(path):
    rules, chosen_counts = Counter(), Counter()
    gave_up, lost_blocks, gaps = 0, [], []
    decisions = 0
    with open(path, errors="replace") as log:
        for line in log:
            match = LINE.search(line)
            if not match:
                continue
            decisions += 1
            _, rule, chosen, _, field = match.groups()
            rules[rule] += 1
            if chosen == "None":
                continue
            chosen = int(chosen)
            chosen_counts[chosen] += 1
            scored = {r: c for r, c in candidates(field).items() if c[6] is None}
            if chosen not in scored:
                continue
            best = max(scored, key=lambda r: sum(scored[r][:3]))
            held = lambda r: sum(scored[r][:3])
            if held(best) > held(chosen):
                gave_up += 1
                lost_blocks.append(held(best) - held(chosen))
                gaps.append((scored[chosen][3], scored[best][3]))
    print(f"{path}: {decisions} decisions; rules: " + ", ".join(f"{r} {n}" for r, n in rules.most_common()))
    print("  requests per replica: " + ", ".join(f"{r}: {n}" for r, n in sorted(chosen_counts.items())))
    if gave_up:
        print(f"  gave up locality {gave_up} times: {sum(lost_blocks)} blocks of 16 tokens less cached in all "
              f"(median {statistics.median(lost_blocks):g} a time); predicted TTFT there: chosen median "
              f"{statistics.median(g[0] for g in gaps):.1f} ms, most-cached median "
              f"{statistics.median(g[1] for g in gaps):.1f} ms")
    else:
        print("  never gave up locality")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for name in sys.argv[1:]:
        summarise(name)
