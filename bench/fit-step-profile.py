#!/usr/bin/env python3
"""Fits a simulator cost profile to the steps a node-agent recorded (`node-agent --step-log FILE`: one JSON
object per engine step with its new tokens, sampled sequences, attention work and seconds).

    bench/fit-step-profile.py STEP_LOG BASE_PROFILE > FITTED_PROFILE

Least squares over the logged steps that sampled a token:

    step seconds = c + a * body FLOPs + r * sampled sequences

c is the step overhead (on tiny-random mostly the LM head's read, which every such step pays once), 1/a the
body's FLOP rate, r what each sampled sequence adds (its row of the LM head and the sampling over the
vocabulary). The output is the base profile with step_overhead_seconds, compute_efficiency and
sample_seconds replaced. Used by bench/sim-check.sh.
"""
import json
import sys


def solve(matrix, vector):
    """Solves a small linear system by Gaussian elimination with partial pivoting."""
    n = len(vector)
    m = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(col + 1, n):
            f = m[i][col] / m[col][col]
            m[i] = [x - f * y for x, y in zip(m[i], m[col])]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    log_path, base_path = sys.argv[1], sys.argv[2]
    log, base = open(log_path).read(), open(base_path).read()
    profile = {}
    for line in base.splitlines():
        body = line.split("#")[0]
        if "=" in body:
            key, value = body.split("=", 1)
            profile[key.strip()] = value.strip()

    def num(key):
        return float(profile[key])

    rows = []
    for line in log.splitlines():
        step = json.loads(line)
        tokens, sampled, attended, seconds = (
            float(step[key]) for key in ("tokens", "sampled", "attended", "step_seconds")
        )
        if sampled > 0:
            flops = 2 * num("params") * tokens + 4 * num("layers") * num("attention_width") * attended
            rows.append(([1.0, flops, sampled], seconds))
    if len(rows) < 20:
        sys.exit(f"only {len(rows)} sampling steps in {log_path}: was the step log on?")
    gram = [[sum(x[i] * x[j] for x, _ in rows) for j in range(3)] for i in range(3)]
    moment = [sum(x[i] * y for x, y in rows) for i in range(3)]
    c, a, r = solve(gram, moment)
    fitted = {
        "compute_efficiency": 1 / (a * num("peak_flops")),
        "step_overhead_seconds": max(c, 0.0),
        "sample_seconds": max(r, 0.0),
    }
    print(
        f"# Fitted by bench/fit-step-profile.py to {len(rows)} steps of {log_path}: {c * 1e3:.2f} ms a step, "
        f"{1 / a / 1e9:.1f} GFLOP/s, {r * 1e3:.2f} ms per sampled sequence."
    )
    for line in base.splitlines():
        key = line.split("#")[0].split("=")[0].strip()
        if key == "name":
            line = f"name = {profile['name']}-fitted"
        elif key in fitted:
            line = f"{key} = {fitted[key]:.6g}"
        print(line)


if __name__ == "__main__":
    main()
