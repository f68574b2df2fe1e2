"""The robustness target, one definition for bench/sim-report.sh's tables: cache_aware's mean and p99 TTFT at
most 5% above the best of the others, its hit ratio (cached prompt fraction) within 1 point of the best."""


def misses(ca, others):
    """The best of `others` by mean, p99 and hit ratio, and how cache_aware misses the target against them."""
    mean = min(others, key=lambda r: r["ttft_mean_s"])
    p99 = min(others, key=lambda r: r["ttft_p99_s"])
    hit = max(others, key=lambda r: r["hit_ratio"])
    found = []
    if ca["ttft_mean_s"] > 1.05 * mean["ttft_mean_s"]:
        found.append(f"mean +{100 * (ca['ttft_mean_s'] / mean['ttft_mean_s'] - 1):.0f}%")
    if ca["ttft_p99_s"] > 1.05 * p99["ttft_p99_s"]:
        found.append(f"p99 +{100 * (ca['ttft_p99_s'] / p99['ttft_p99_s'] - 1):.0f}%")
    if ca["hit_ratio"] < hit["hit_ratio"] - 0.01:
        found.append(f"hit -{100 * (hit['hit_ratio'] - ca['hit_ratio']):.1f} pt")
    return mean, p99, hit, found


def each_policy_met(cells):
    """Per policy, the cells where it meets the target against all the other policies (cache_aware included),
    and how many cells some policy meets it in: how attainable the target is for any one policy."""
    met, attainable = {}, 0
    for results in cells:
        winners = [r["policy"] for r in results if not misses(r, [o for o in results if o is not r])[3]]
        attainable += bool(winners)
        for r in results:
            met[r["policy"]] = met.get(r["policy"], 0) + (r["policy"] in winners)
    return met, attainable


def pairwise_met(cells, policy="cache_aware"):
    """Per other policy, the cells where `policy` meets the target against that one policy alone (where an
    operator who picked that policy instead would not have had TTFT more than 5% lower or a hit ratio more than
    a point higher), and the cells where that policy meets it against `policy` alone."""
    met = {}
    for results in cells:
        mine = next(r for r in results if r["policy"] == policy)
        for other in results:
            if other is not mine:
                mine_met, other_met = met.get(other["policy"], (0, 0))
                met[other["policy"]] = (mine_met + (not misses(mine, [other])[3]),
                                        other_met + (not misses(other, [mine])[3]))
    return met
