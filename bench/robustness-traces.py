#!/usr/bin/env python3
"""Writes the robustness suite's generated traces (Mooncake format, as kvroute-sim --trace reads them).

    bench/robustness-traces.py OUT_DIR [--seed N]

One file per family, OUT_DIR/FAMILY.jsonl: one JSON object per request with `timestamp` (ms),
`input_length`, `output_length` and `hash_ids` (one id per 512-token unit; ids are nodes of a prefix tree,
so two requests share exactly their leading run of equal ids). The families cover traffic shapes the
repository's own trace and workloads do not:

  zipf-docs      long shared documents (4-24k tokens) with Zipf popularity, a short question each
  many-tenants   400 tenants with their own system prompts (Zipf popularity), multi-turn chat
  bursty         chat sessions of 20 tenants arriving in bursts (8x the mean rate for 5 s of every 30 s)
  agentic-long   agent sessions whose context grows to 50-120k tokens over dozens of turns of tool results
  long-short     90% short chat turns behind 10 shared system prompts, 10% long documents (15-50k tokens)

Arrival times are scaled so that every family asks, at kvroute-sim's --rate-scale 1, for the same
rate of prompt tokens that no cache could have held (the first sight of each unit): 60,000 tokens/s, about
a quarter of what 8 h100-llama3-8b replicas prefill. --rate-scale 2 and 4 are then moderate load and
overload for 8 replicas; 32 replicas take 4 times the rate scale for the same load per replica.
Deterministic for a seed; the standard library only.
"""
import json
import os
import random
import sys

UNIT = 512
UNCACHED_TOKENS_PER_S = 60_000.0


class Ids:
    """Fresh prefix-tree node ids."""

    def __init__(self):
        self.next = 0

    def take(self, n):
        first = self.next
        self.next += n
        return list(range(first, first + n))


def zipf_choice(rng, n, s):
    weights = [1.0 / (rank + 1) ** s for rank in range(n)]
    return lambda: rng.choices(range(n), weights)[0]


def request(at_s, units, tail_tokens, output):
    """A request whose prompt is the full units plus a last partial one of `tail_tokens`."""
    return {"t": at_s, "hash_ids": units, "input_length": (len(units) - 1) * UNIT + tail_tokens,
            "output_length": output}


def poisson_times(rng, count, rate):
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def sessions(rng, ids, starts, prefix_of, turns_of, think_s, turn_units, output_of, max_units=256):
    """Multi-turn sessions: each turn's prompt is the previous prompt plus the turn's new units."""
    out = []
    for start in starts:
        history = list(prefix_of())
        t = start
        for _ in range(turns_of()):
            history += ids.take(turn_units())
            if len(history) > max_units:
                break
            out.append(request(t, list(history), rng.randint(64, UNIT), output_of()))
            t += think_s()
    return out


def zipf_docs(rng, ids):
    system = ids.take(1)
    docs = [ids.take(rng.randint(8, 48)) for _ in range(300)]
    pick = zipf_choice(rng, len(docs), 1.1)
    return [request(t, system + docs[pick()] + ids.take(1), rng.randint(50, 400), rng.randint(100, 300))
            for t in poisson_times(rng, 3000, 1.0)]


def many_tenants(rng, ids):
    prompts = [ids.take(rng.randint(2, 6)) for _ in range(400)]
    pick = zipf_choice(rng, len(prompts), 1.0)
    return sessions(rng, ids, poisson_times(rng, 1000, 1.0), lambda: prompts[pick()],
                    lambda: rng.randint(2, 8), lambda: rng.uniform(5, 30), lambda: 1,
                    lambda: rng.randint(50, 400))


def bursty(rng, ids):
    prompts = [ids.take(rng.randint(2, 8)) for _ in range(20)]
    pick = zipf_choice(rng, len(prompts), 1.0)
    # Session starts: 8x the base rate for 5 s of every 30 s, 0.3x in between.
    starts, t = [], 0.0
    while len(starts) < 1000:
        in_burst = (t % 30.0) < 5.0
        t += rng.expovariate(8.0 if in_burst else 0.3)
        starts.append(t)
    return sessions(rng, ids, starts, lambda: prompts[pick()], lambda: rng.randint(2, 6),
                    lambda: rng.uniform(2, 10), lambda: 1, lambda: rng.randint(50, 300))


def agentic_long(rng, ids):
    agents = [ids.take(rng.randint(8, 16)) for _ in range(4)]
    out = []
    for start in poisson_times(rng, 60, 1.0):
        target_units = rng.randint(50_000, 120_000) // UNIT
        history = list(rng.choice(agents)) + ids.take(1)
        t = start
        while len(history) < target_units:
            history += ids.take(rng.randint(1, 8))
            out.append(request(t, list(history), rng.randint(64, UNIT), rng.randint(100, 500)))
            t += rng.uniform(1, 5)
    return out


def long_short(rng, ids):
    systems = [ids.take(2) for _ in range(10)]
    shared_docs = [ids.take(rng.randint(30, 100)) for _ in range(50)]
    out = []
    for t in poisson_times(rng, 3000, 1.0):
        if rng.random() < 0.9:
            out.append(request(t, rng.choice(systems) + ids.take(1), rng.randint(50, 400), rng.randint(50, 300)))
        else:
            doc = rng.choice(shared_docs) if rng.random() < 0.2 else ids.take(rng.randint(30, 100))
            out.append(request(t, doc + ids.take(1), rng.randint(50, 400), rng.randint(100, 300)))
    return out


FAMILIES = {
    "zipf-docs": zipf_docs,
    "many-tenants": many_tenants,
    "bursty": bursty,
    "agentic-long": agentic_long,
    "long-short": long_short,
}


def write(path, requests):
    """Sorts by arrival, scales time to the target uncached token rate, writes the trace."""
    requests.sort(key=lambda r: r["t"])
    seen, uncached = set(), 0
    for r in requests:
        for i, unit in enumerate(r["hash_ids"]):
            if unit not in seen:
                seen.add(unit)
                uncached += min(UNIT, r["input_length"] - i * UNIT)
    span = max(r["t"] for r in requests) or 1.0
    scale = (uncached / UNCACHED_TOKENS_PER_S) / span
    with open(path, "w") as out:
        for r in requests:
            out.write(json.dumps({"timestamp": int(r["t"] * scale * 1000), "input_length": r["input_length"],
                                  "output_length": r["output_length"], "hash_ids": r["hash_ids"]}) + "\n")
    return len(requests), uncached, span * scale


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    out_dir, seed = args[0], 1
    if "--seed" in args:
        seed = int(args[args.index("--seed") + 1])
    os.makedirs(out_dir, exist_ok=True)
    for name, generate in FAMILIES.items():
        rng = random.Random(f"{name}-{seed}")
        count, uncached, seconds = write(os.path.join(out_dir, f"{name}.jsonl"), generate(rng, Ids()))
        print(f"{name}: {count} requests, {uncached / 1e6:.1f}M uncached tokens over {seconds:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
