#!/usr/bin/env bash
# Checks the simulator's cost model against the real engine on a one-agent local cluster (tiny-random):
#  1. calibration: runs the workload with another seed (other sessions) and the agent's step log on, and
#     fits a CPU profile to those steps (bench/fit-step-profile.py: cpu-tiny-random with its compute
#     efficiency, step overhead and per-sampled-sequence cost fitted);
#  2. validation: runs the workload itself, then the same sessions in kvroute-sim with the fitted profile
#     and with the built-in cpu-tiny-random (fitted to the model timed alone by the step_costs example),
#     both with the cluster's pool and tier sizes, and prints the distributions side by side.
# Reports land in .run/sim-check/.
#
#   bench/sim-check.sh [--workload chat] [--sessions 20] [--turns 4] [--rate 0.5] [--max-tokens 32]
set -euo pipefail
cd "$(dirname "$0")/.."

workload=chat
sessions=20
turns=4
rate=0.5
max_tokens=32
think_ms=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --workload) workload="$2"; shift 2 ;;
    --sessions) sessions="$2"; shift 2 ;;
    --turns) turns="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    *) sed -n '2,7p' "$0" >&2; exit 2 ;;
  esac
done

out=.run/sim-check
mkdir -p "$out"
cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench
# What deploy/local/up.sh gives each agent: 48 MiB of KV pool, 96 MiB of host tier, a 512 MB Redis.
pool=$((48 << 20))
host=$((96 << 20))
network=$((512 << 20))
shape=(--workload "$workload" --sessions "$sessions" --turns "$turns" --rate "$rate" --think-ms "$think_ms"
  --max-tokens "$max_tokens")
workload_args=("${shape[@]}" --seed 1)

http_port=18080
source bench/cluster.sh
trap stop_cluster EXIT INT TERM

echo "== calibration: the same workload with other sessions, the agent's step log on" >&2
start_cluster "$http_port" 18051 "$out/calibration-cluster.log" --agents 1 --model tiny-random --step-logs
target/release/kvroute-load --url "http://127.0.0.1:$http_port" "${shape[@]}" --seed 2 --duration-secs 600 --json \
  >"$out/calibration.json" 2>/dev/null
stop_cluster
cp .run/agent-0.steps.jsonl "$out/calibration-steps.jsonl"
bench/fit-step-profile.py "$out/calibration-steps.jsonl" bench/profiles/cpu-tiny-random.profile >"$out/fitted.profile"
head -1 "$out/fitted.profile" >&2

echo "== validation: the real engine" >&2
start_cluster "$http_port" 18051 "$out/cluster.log" --agents 1 --model tiny-random
target/release/kvroute-load --url "http://127.0.0.1:$http_port" "${workload_args[@]}" --duration-secs 600 --json \
  >"$out/measured.json" 2>/dev/null
# The agent's own view: decode step times and its measured prefill rate (deploy/local/up.sh's metrics port).
curl -fsS http://127.0.0.1:9101/metrics >"$out/agent.metrics" || true
stop_cluster

echo "== validation: the simulator, one replica, fitted and built-in profiles" >&2
for profile in fitted builtin; do
  file="$out/fitted.profile"
  [ "$profile" = builtin ] && file=cpu-tiny-random
  target/release/kvroute-sim "${workload_args[@]}" --replicas 1 --policy cache_aware --profile "$file" \
    --kv-pool-bytes "$pool" --host-bytes "$host" --network-bytes "$network" --json >"$out/simulated-$profile.json"
done

python3 - "$out/measured.json" "$out/simulated-fitted.json" "$out/simulated-builtin.json" <<'EOF'
import json, sys
measured = json.load(open(sys.argv[1]))
fitted, builtin = (json.load(open(path))["results"][0] for path in sys.argv[2:])
rows = [
    ("requests", measured["succeeded"], "requests", 1),
    ("cached fraction", measured["cached_fraction"], "hit_ratio", 1),
    ("TTFT mean ms", measured["ttft"]["mean_ms"], "ttft_mean_s", 1e3),
    ("TTFT p50 ms", measured["ttft"]["p50_ms"], "ttft_p50_s", 1e3),
    ("TTFT p90 ms", measured["ttft"]["p90_ms"], "ttft_p90_s", 1e3),
    ("TTFT p99 ms", measured["ttft"]["p99_ms"], "ttft_p99_s", 1e3),
    ("end to end p50 ms", measured["end_to_end"]["p50_ms"], "e2e_p50_s", 1e3),
]
print("| measure | real engine | simulated, fitted profile | ratio | simulated, built-in profile | ratio |")
print("|---|---|---|---|---|---|")
for name, real, key, scale in rows:
    fmt = (lambda v: f"{v:.3f}") if name == "cached fraction" else (lambda v: f"{v:,.0f}")
    cells = [fmt(real)]
    for sim in (fitted[key] * scale, builtin[key] * scale):
        cells += [fmt(sim), f"{sim / real:.2f}" if real else "-"]
    print(f"| {name} | " + " | ".join(cells) + " |")
EOF
