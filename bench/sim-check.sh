#!/usr/bin/env bash
# Checks the simulator's cost model against the real engine: runs a small workload on a one-agent local
# cluster (tiny-random), then the same workload in kvroute-sim with the cpu-tiny-random profile and the
# cluster's pool and tier sizes, and prints the two TTFT distributions side by side.
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
workload_args=(--workload "$workload" --sessions "$sessions" --turns "$turns" --rate "$rate" --think-ms "$think_ms"
  --max-tokens "$max_tokens" --seed 1)

http_port=18080
source bench/cluster.sh
trap stop_cluster EXIT INT TERM

echo "== the real engine: one agent, tiny-random" >&2
start_cluster "$http_port" 18051 "$out/cluster.log" --agents 1 --model tiny-random
target/release/kvroute-load --url "http://127.0.0.1:$http_port" "${workload_args[@]}" --duration-secs 600 --json \
  >"$out/measured.json" 2>/dev/null
# The agent's own view: decode step times and its measured prefill rate (deploy/local/up.sh's metrics port).
curl -fsS http://127.0.0.1:9101/metrics >"$out/agent.metrics" || true
stop_cluster

echo "== the simulator: one replica, cpu-tiny-random" >&2
target/release/kvroute-sim "${workload_args[@]}" --replicas 1 --policy cache_aware --profile cpu-tiny-random \
  --kv-pool-bytes "$pool" --host-bytes "$host" --network-bytes "$network" --json >"$out/simulated.json"

python3 - "$out/measured.json" "$out/simulated.json" <<'EOF'
import json, sys
measured, simulated = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["results"][0]
rows = [
    ("requests", measured["succeeded"], simulated["requests"]),
    ("cached fraction", measured["cached_fraction"], simulated["hit_ratio"]),
    ("TTFT mean ms", measured["ttft"]["mean_ms"], simulated["ttft_mean_s"] * 1e3),
    ("TTFT p50 ms", measured["ttft"]["p50_ms"], simulated["ttft_p50_s"] * 1e3),
    ("TTFT p90 ms", measured["ttft"]["p90_ms"], simulated["ttft_p90_s"] * 1e3),
    ("TTFT p99 ms", measured["ttft"]["p99_ms"], simulated["ttft_p99_s"] * 1e3),
    ("end to end p50 ms", measured["end_to_end"]["p50_ms"], simulated["e2e_p50_s"] * 1e3),
]
print("| measure | real engine | simulated | simulated / real |")
print("|---|---|---|---|")
for name, real, sim in rows:
    ratio = f"{sim / real:.2f}" if real else "-"
    fmt = (lambda v: f"{v:.3f}") if name == "cached fraction" else (lambda v: f"{v:,.0f}")
    print(f"| {name} | {fmt(real)} | {fmt(sim)} | {ratio} |")
EOF
