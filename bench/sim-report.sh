#!/usr/bin/env bash
# Runs the simulator comparisons recorded in docs/benchmarks.md and keeps every report in .run/sim/.
#   bench/sim-report.sh            # all of them (tens of minutes on 2 cores)
#   bench/sim-report.sh NAME...    # some of them: trace, trace-no-tiers, trace-32, trace-32-no-tiers, workloads,
#                                  # workloads-no-tiers, workloads-32, workloads-32-no-tiers, shared-prefix,
#                                  # shared-prefix-no-tiers, shared-prefix-32, shared-prefix-32-no-tiers, scale
#   bench/sim-report.sh robustness # the robustness suite (only when named): every workload family (the
#       repository's trace, the synthetic workloads, shared-prefix, and the generated families of
#       bench/robustness-traces.py) at rate scales 1, 2 and 4, at 8 and 32 replicas (32: 4 times the rate),
#       with and without tiers; one table of cache_aware against the best other policy per cell, with the
#       verdict (mean and p99 TTFT at most 5% above the best other's, hit ratio within 1 point of the best).
#       ROBUSTNESS_FAMILIES, ROBUSTNESS_SCALES, ROBUSTNESS_REPLICAS ("8 32") and ROBUSTNESS_TIERS ("on off")
#       narrow it; cells already in .run/sim/robustness/ are kept unless ROBUSTNESS_FRESH=1.
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

want() { [ -z "$selected" ] || [[ " $selected " == *" $1 "* ]]; }
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

# The robustness suite: only when named.
if [[ " $selected " == *" robustness "* ]]; then
  rob=$out/robustness
  mkdir -p "$rob/traces"
  bench/robustness-traces.py "$rob/traces"
  families=${ROBUSTNESS_FAMILIES:-"trace chat agent rag fewshot timestamp-top shared-prefix zipf-docs many-tenants bursty agentic-long long-short"}
  cells=()
  for family in $families; do
    for replicas in ${ROBUSTNESS_REPLICAS:-8 32}; do
      per=$((replicas / 8))
      case "$family" in
        trace) base=(--trace "$trace") ;;
        shared-prefix) base=(--workload shared-prefix --groups $((150 * per)) --requests $((4500 * per)) --rate $((16 * per))
          --kv-pool-bytes 40000000000) ;;
        chat|agent|rag|fewshot|timestamp-top) base=(--workload "$family" --sessions $((1000 * per)) --rate $((50 * per))) ;;
        *) base=(--trace "$rob/traces/$family.jsonl") ;;
      esac
      for scale in ${ROBUSTNESS_SCALES:-1 2 4}; do
        # A trace is fixed, so at 32 replicas it is replayed 4 times faster (the same load per replica);
        # the synthetic workloads already have 4 times the sessions and rate.
        rate_scale=$scale
        case "$family" in chat|agent|rag|fewshot|timestamp-top|shared-prefix) ;; *) rate_scale=$((scale * per)) ;; esac
        for tiers in ${ROBUSTNESS_TIERS:-on off}; do
          cell="$family-$replicas-x$scale-tiers-$tiers"
          cells+=("$cell")
          [ -s "$rob/$cell.json" ] && [ "${ROBUSTNESS_FRESH:-0}" != 1 ] && continue
          extra=()
          [ "$tiers" = off ] && extra=("${no_tiers[@]}")
          echo "== robustness $cell" >&2
          "$sim" "${base[@]}" --replicas "$replicas" --policy all --profile h100-llama3-8b --rate-scale "$rate_scale" \
            "${extra[@]}" --json >"$rob/$cell.json.partial"
          mv "$rob/$cell.json.partial" "$rob/$cell.json"
        done
      done
    done
  done
  python3 - "$rob" "${cells[@]}" <<'EOF'
import json, os, sys
rob, cells = sys.argv[1], sys.argv[2:]
print("robustness: cache_aware against the best other policy per cell (TTFT in s; hit: cached prompt fraction;")
print("429s: requests cache_aware's replicas refused, against the fewest of the others)")
print(f"{'cell':<36} {'ca mean':>8} {'best mean':>17} {'ca p99':>8} {'best p99':>17} {'ca hit':>6} "
      f"{'best hit':>16} {'429s':>11} verdict")
met = 0
for cell in cells:
    results = {r["policy"]: r for r in json.load(open(os.path.join(rob, cell + ".json")))["results"]}
    ca = results.pop("cache_aware")
    mean = min(results.values(), key=lambda r: r["ttft_mean_s"])
    p99 = min(results.values(), key=lambda r: r["ttft_p99_s"])
    hit = max(results.values(), key=lambda r: r["hit_ratio"])
    fewest_refused = min(r["rejected"] for r in results.values())
    misses = []
    if ca["ttft_mean_s"] > 1.05 * mean["ttft_mean_s"]:
        misses.append(f"mean +{100 * (ca['ttft_mean_s'] / mean['ttft_mean_s'] - 1):.0f}%")
    if ca["ttft_p99_s"] > 1.05 * p99["ttft_p99_s"]:
        misses.append(f"p99 +{100 * (ca['ttft_p99_s'] / p99['ttft_p99_s'] - 1):.0f}%")
    if ca["hit_ratio"] < hit["hit_ratio"] - 0.01:
        misses.append(f"hit -{100 * (hit['hit_ratio'] - ca['hit_ratio']):.1f} pt")
    met += not misses
    print(f"{cell:<36} {ca['ttft_mean_s']:8.3f} {mean['ttft_mean_s']:8.3f} {mean['policy']:>8} "
          f"{ca['ttft_p99_s']:8.2f} {p99['ttft_p99_s']:8.2f} {p99['policy']:>8} {ca['hit_ratio']:6.3f} "
          f"{hit['hit_ratio']:6.3f} {hit['policy']:>9} {ca['rejected']:5d}/{fewest_refused:<5d} "
          f"{'met' if not misses else 'MISSED: ' + ', '.join(misses)}")
print(f"{met} of {len(cells)} cells met")
EOF
fi
