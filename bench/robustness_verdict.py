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
