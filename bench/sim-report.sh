#!/usr/bin/env bash
# Runs the simulator comparisons recorded in docs/benchmarks.md and keeps every report in .run/sim/.
#   bench/sim-report.sh            # all of them (tens of minutes on 2 cores)
#   bench/sim-report.sh NAME...    # some of them: trace, trace-no-tiers, trace-32, trace-32-no-tiers, workloads,
#                                  # workloads-no-tiers, workloads-32, workloads-32-no-tiers, shared-prefix,
#                                  # shared-prefix-no-tiers, shared-prefix-32, shared-prefix-32-no-tiers, scale
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-bench --bin kvroute-sim
sim=target/release/kvroute-sim
trace=bench/testdata/mooncake_conversation_trace.jsonl
out=.run/sim
mkdir -p "$out"

run() { # NAME ARGS...
  local name="$1"
  shift
  echo "== $name: kvroute-sim $*"
  local started=$SECONDS
  "$sim" "$@" --json --plot "$out/$name" >"$out/$name.json"
  python3 - "$out/$name.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  one infinite cache: hit ratio {r['bound_hit_ratio']:.3f}")
print("  policy        hit    gpu   host   net  ttft_mean ttft_p50 ttft_p99  out_tok/s imbal preempt")
for p in r["results"]:
    print(f"  {p['policy']:<13} {p['hit_ratio']:.3f} {p['hit_ratio_gpu']:.3f} {p['hit_ratio_host']:.3f} "
          f"{p['hit_ratio_network']:.3f} {p['ttft_mean_s']:9.3f} {p['ttft_p50_s']:8.3f} {p['ttft_p99_s']:8.3f} "
          f"{p['output_tokens_per_s']:10.0f} {p['load_imbalance']:5.2f} {p['preemptions']:7d}")
EOF
  echo "  ($((SECONDS - started)) s)"
}

no_tiers=(--host-bytes 0 --network-bytes 0)

want() { [ $# -eq 0 ] || [[ " $selected " == *" $1 "* ]]; }
selected="$*"

if want trace; then
  run trace --trace "$trace" --replicas 8 --policy all --profile h100-llama3-8b --rate-scale 2
fi
if want trace-no-tiers; then
  run trace-no-tiers --trace "$trace" --replicas 8 --policy all --profile h100-llama3-8b --rate-scale 2 \
    "${no_tiers[@]}"
fi
if want trace-32; then
  run trace-32 --trace "$trace" --replicas 32 --policy all --profile h100-llama3-8b --rate-scale 8
fi
if want trace-32-no-tiers; then
  run trace-32-no-tiers --trace "$trace" --replicas 32 --policy all --profile h100-llama3-8b --rate-scale 8 \
    "${no_tiers[@]}"
fi
for workload in chat agent rag fewshot timestamp-top; do
  if want workloads; then
    run "$workload-8" --workload "$workload" --replicas 8 --policy all --sessions 3000 --rate 200
  fi
  if want workloads-no-tiers; then
    run "$workload-8-no-tiers" --workload "$workload" --replicas 8 --policy all --sessions 3000 --rate 200 "${no_tiers[@]}"
  fi
  if want workloads-32; then
    run "$workload-32" --workload "$workload" --replicas 32 --policy all --sessions 12000 --rate 800
  fi
  if want workloads-32-no-tiers; then
    run "$workload-32-no-tiers" --workload "$workload" --replicas 32 --policy all --sessions 12000 --rate 800 \
      "${no_tiers[@]}"
  fi
done
# llm-d's experiment: 150 groups x 6,000-token system prompts, 5 users x 1,200-token questions, 1,000 output
# tokens; 40 GB pools put its 236 GB of distinct prefixes at 74% of the cluster's KV. At 32 replicas, four
# times the groups, requests and rate keep that ratio and the load per replica.
shared_8=(--workload shared-prefix --replicas 8 --policy all --requests 4500 --rate 16 --kv-pool-bytes 40000000000)
shared_32=(--workload shared-prefix --replicas 32 --policy all --groups 600 --requests 18000 --rate 64
  --kv-pool-bytes 40000000000)
if want shared-prefix; then
  run shared-prefix "${shared_8[@]}"
fi
if want shared-prefix-no-tiers; then
  run shared-prefix-no-tiers "${shared_8[@]}" "${no_tiers[@]}"
fi
if want shared-prefix-32; then
  run shared-prefix-32 "${shared_32[@]}"
fi
if want shared-prefix-32-no-tiers; then
  run shared-prefix-32-no-tiers "${shared_32[@]}" "${no_tiers[@]}"
fi
if want scale; then
  for replicas in 8 32 128; do
    run "scale-$replicas" --workload chat --replicas "$replicas" --policy cache_aware,round_robin,least_loaded \
      --sessions $((375 * replicas)) --rate $((25 * replicas))
  done
fi
