#!/usr/bin/env bash
# Runs every synthetic workload under several routing policies on the local cluster
# (deploy/local/up.sh, a fresh cluster for each pair so no run inherits another's cache)
# and prints one markdown table. Reports land in .run/matrix/POLICY-WORKLOAD.json.
#
#   bench/policy-matrix.sh [--agents 4] [--model tiny-random] [--kv-cache-bytes 4MiB]
#                          [--policies "cache_aware round_robin least_loaded"]
#                          [--workloads "chat agent rag fewshot timestamp-top"] [--no-network-tier]
#                          [-- KVROUTE-LOAD ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

agents=4
model="tiny-random"
kv_cache_bytes="4MiB"
policies="cache_aware round_robin least_loaded"
workloads="chat agent rag fewshot timestamp-top"
cluster_args=()
load_args=(--sessions 24 --turns 6 --rate 1 --think-ms 1000 --max-tokens 32 --duration-secs 90)
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) agents="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --kv-cache-bytes) kv_cache_bytes="$2"; shift 2 ;;
    --policies) policies="$2"; shift 2 ;;
    --workloads) workloads="$2"; shift 2 ;;
    --no-network-tier) cluster_args+=(--no-network-tier); shift ;;
    --) shift; load_args=("$@"); break ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
  esac
done

http_port=18080
out=.run/matrix
mkdir -p "$out"
cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench

source bench/cluster.sh
trap stop_cluster EXIT INT TERM

for workload in $workloads; do
  for policy in $policies; do
    echo "== $workload under $policy" >&2
    start_cluster "$http_port" 18051 "$out/$policy-$workload.cluster.log" --agents "$agents" --model "$model" \
      --policy "$policy" --kv-cache-bytes "$kv_cache_bytes" "${cluster_args[@]}"
    target/release/kvroute-load --url "http://127.0.0.1:$http_port" --workload "$workload" --json "${load_args[@]}" \
      >"$out/$policy-$workload.json" 2>/dev/null
    curl -fsS "http://127.0.0.1:$http_port/metrics" >"$out/$policy-$workload.gateway.metrics"
    stop_cluster
  done
done

python3 - "$out" "$workloads" "$policies" <<'EOF'
import json, sys
out, workloads, policies = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def churn(path):
    for line in open(path):
        if line.startswith("kvroute_gateway_prefix_churn_total"):
            return int(float(line.split()[-1]))
    return 0
print("| workload | policy | requests ok | cached fraction | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | e2e p50 ms | output tok/s | errors | churn alarms |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    for p in policies:
        r = json.load(open(f"{out}/{p}-{w}.json"))
        errors = sum(r["errors"].values())
        print(f"| {w} | {p} | {r['succeeded']}/{r['requests']} | {r['cached_fraction']:.1%} | {r['ttft']['p50_ms']:.0f} | "
              f"{r['ttft']['p90_ms']:.0f} | {r['ttft']['p99_ms']:.0f} | {r['end_to_end']['p50_ms']:.0f} | "
              f"{r['output_tokens_per_second']:.1f} | {errors} | {churn(f'{out}/{p}-{w}.gateway.metrics')} |")
EOF
