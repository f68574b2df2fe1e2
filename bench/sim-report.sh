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
#       narrow it; cells already in .run/sim/robustness/ are kept unless ROBUSTNESS_FRESH=1. The trace
#       families also run on the dynamo-mocker profile (Dynamo's mocker engine, no tiers) beside the real
#       Dynamo 1.6.1 router replaying the same trace (bench/dynamo-replay.py; scripts/tools/dynamo.sh
#       installs it): a "Dynamo (real)" table.
#   bench/sim-report.sh ablation   # what each term of cache_aware's score buys: cache_aware with all of them
#       and without each (kvroute-sim --without), on twelve robustness cells, 8 replicas, tiers on (only when
#       named; reuses the robustness suite's cells for the other policies when they are there).
#   bench/sim-report.sh dynamo-check # kvroute-sim's dynamo-mocker profile against Dynamo's own replay on the
#       repository's trace at its rate and 4 times it: round_robin for the engine model, the dynamo baseline
#       for the router (only when named).
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

# One trace through Dynamo's real router and mocker engines (bench/dynamo-replay.py): OUT TRACE WORKERS SPEEDUP MODE
dynamo_replay() {
  [ -s "$1" ] && [ "${ROBUSTNESS_FRESH:-0}" != 1 ] && return 0
  "$dynamo_python" bench/dynamo-replay.py "$2" --workers "$3" --speedup "$4" --router-mode "$5" >"$1.partial"
  mv "$1.partial" "$1"
}

if [[ " $selected " == *" dynamo-check "* ]]; then
  dynamo_python=$(scripts/tools/dynamo.sh)
  check=$out/dynamo-check
  mkdir -p "$check"
  for scale in 1 4; do
    "$sim" --trace "$trace" --replicas 8 --policy round_robin,dynamo,cache_aware --profile dynamo-mocker \
      --rate-scale "$scale" --json >"$check/sim-x$scale.json"
    for mode in round_robin kv_router; do
      dynamo_replay "$check/dynamo-$mode-x$scale.json" "$trace" 8 "$scale" "$mode"
    done
  done
  python3 - "$check" <<'EOF'
import json, os, sys
d = sys.argv[1]
print("dynamo-check: the repository's trace, 8 workers of 28,610 16-token blocks, no tiers (TTFT in s; reuse:")
print("cached prompt fraction, Dynamo's counted at first admission)")
print(f"{'rate':<5} {'router':<24} {'reuse':>6} {'mean':>7} {'p50':>7} {'p99':>7} {'refused':>7}")
for scale in (1, 4):
    sim = {r["policy"]: r for r in json.load(open(os.path.join(d, f"sim-x{scale}.json")))["results"]}
    rows = [("kvroute-sim round_robin", sim["round_robin"]), ("Dynamo round_robin", "round_robin"),
            ("kvroute-sim dynamo", sim["dynamo"]), ("Dynamo kv_router", "kv_router"),
            ("kvroute-sim cache_aware", sim["cache_aware"])]
    for name, r in rows:
        if isinstance(r, str):
            x = json.load(open(os.path.join(d, f"dynamo-{r}-x{scale}.json")))
            reuse = x["first_admission_prefix_cache_reused_ratio"] or x["prefix_cache_reused_ratio"]
            print(f"x{scale:<4} {name:<24} {reuse:6.3f} {x['ttft_mean_s']:7.3f} {x['ttft_p50_s']:7.3f} "
                  f"{x['ttft_p99_s']:7.2f} {x['requests'] - x['completed']:7d}")
        else:
            print(f"x{scale:<4} {name:<24} {r['hit_ratio']:6.3f} {r['ttft_mean_s']:7.3f} {r['ttft_p50_s']:7.3f} "
                  f"{r['ttft_p99_s']:7.2f} {r['rejected']:7d}")
EOF
fi

# What each term of cache_aware's score buys: only when named.
if [[ " $selected " == *" ablation "* ]]; then
  rob=$out/robustness
  abl=$out/ablation
  mkdir -p "$rob/traces" "$abl"
  bench/robustness-traces.py "$rob/traces"
  variants=("all" mean-floor delay-to-others eviction memory-wait slot-wait in-flight decode-delay prefix-copy)
  cells=(trace:1 trace:4 rag:4 fewshot:2 timestamp-top:2 shared-prefix:1 shared-prefix:2 zipf-docs:1 many-tenants:4
    bursty:4 agentic-long:1 long-short:2)
  for spec in "${cells[@]}"; do
    family=${spec%%:*}
    scale=${spec#*:}
    case "$family" in
      trace) base=(--trace "$trace") ;;
      shared-prefix) base=(--workload shared-prefix --groups 150 --requests 4500 --rate 16 --kv-pool-bytes 40000000000) ;;
      chat|agent|rag|fewshot|timestamp-top) base=(--workload "$family" --sessions 1000 --rate 50) ;;
      *) base=(--trace "$rob/traces/$family.jsonl") ;;
    esac
    cell="$family-8-x$scale-tiers-on"
    if [ ! -s "$rob/$cell.json" ]; then
      echo "== ablation: the other policies on $cell" >&2
      "$sim" "${base[@]}" --replicas 8 --policy all --profile h100-llama3-8b --rate-scale "$scale" --json \
        >"$rob/$cell.json.partial"
      mv "$rob/$cell.json.partial" "$rob/$cell.json"
    fi
    for variant in "${variants[@]}"; do
      [ -s "$abl/$cell-$variant.json" ] && [ "${ROBUSTNESS_FRESH:-0}" != 1 ] && continue
      without=()
      [ "$variant" != all ] && without=(--without "$variant")
      echo "== ablation: cache_aware without $variant on $cell" >&2
      "$sim" "${base[@]}" --replicas 8 --policy cache_aware --profile h100-llama3-8b --rate-scale "$scale" \
        "${without[@]}" --json >"$abl/$cell-$variant.json.partial"
      mv "$abl/$cell-$variant.json.partial" "$abl/$cell-$variant.json"
    done
  done
  python3 - "$rob" "$abl" "${variants[*]}" "${cells[@]}" <<'EOF'
import json, math, os, sys
rob, abl, variants, specs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
print("ablation: cache_aware with every term, and without each (8 replicas, tiers on). Per cell: mean TTFT / p99 TTFT in s")
print("/ hit ratio / 429s; the last rows sum, over the cells, how far each variant is above the best other policy")
print("(log of the ratio, 0 when at or below) and the hit points it is below the best")
cells = [f"{spec.split(':')[0]}-8-x{spec.split(':')[1]}-tiers-on" for spec in specs]
print(f"{'cell':<30} " + " ".join(f"{('without ' + v) if v != 'all' else 'all terms':>27}" for v in variants))
regret = {v: [0.0, 0.0, 0.0, 0] for v in variants}
for cell in cells:
    others = [r for r in json.load(open(os.path.join(rob, cell + ".json")))["results"] if r["policy"] != "cache_aware"]
    best_mean = min(r["ttft_mean_s"] for r in others)
    best_p99 = min(r["ttft_p99_s"] for r in others)
    best_hit = max(r["hit_ratio"] for r in others)
    row = f"{cell:<30} "
    for v in variants:
        r = json.load(open(os.path.join(abl, f"{cell}-{v}.json")))["results"][0]
        row += f"{r['ttft_mean_s']:7.3f}/{r['ttft_p99_s']:6.2f}/{r['hit_ratio']:.3f}/{r['rejected']:<4} "
        regret[v][0] += max(0.0, math.log(r["ttft_mean_s"] / best_mean))
        regret[v][1] += max(0.0, math.log(r["ttft_p99_s"] / best_p99))
        regret[v][2] += max(0.0, best_hit - r["hit_ratio"]) * 100
        regret[v][3] += r["rejected"]
    print(row)
for index, name in enumerate(["mean above best", "p99 above best", "hit points below", "429s"]):
    print(f"{name:<30} " + " ".join(f"{regret[v][index]:>27.2f}" if index < 3 else f"{regret[v][index]:>27d}" for v in variants))
EOF
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
sys.path.insert(0, "bench")
from robustness_verdict import each_policy_met, misses, pairwise_met
rob, cells = sys.argv[1], sys.argv[2:]
print("robustness: cache_aware against the best other policy per cell (TTFT in s; hit: cached prompt fraction;")
print("429s: requests cache_aware's replicas refused, against the fewest of the others). verdict: the target as")
print("written; served: the same with TTFT compared only against the policies that refused no more requests")
print("(a policy that refuses more has its TTFT over fewer requests). in 10 s: requests whose first token came within")
print("the agents' queue-delay limit, cache_aware's against the most of the others")
print(f"{'cell':<36} {'ca mean':>8} {'best mean':>17} {'ca p99':>8} {'best p99':>17} {'ca hit':>6} "
      f"{'best hit':>16} {'429s':>11} {'in 10 s':>13} verdict / served")

met = served_met = 0
everyone = []
for cell in cells:
    everyone.append(json.load(open(os.path.join(rob, cell + ".json")))["results"])
    results = {r["policy"]: r for r in everyone[-1]}
    ca = results.pop("cache_aware")
    mean, p99, hit, missed = misses(ca, list(results.values()))
    fewest_refused = min(r["rejected"] for r in results.values())
    # TTFT against the policies that served at least as many requests; the hit ratio against all.
    serving = [r for r in results.values() if r["rejected"] <= ca["rejected"]]
    served_missed = [m for m in misses(ca, serving or [ca])[3] if not m.startswith("hit")]
    served_missed += [m for m in missed if m.startswith("hit")]
    met += not missed
    served_met += not served_missed
    verdict = "met" if not missed else "MISSED: " + ", ".join(missed)
    served = "met" if not served_missed else "MISSED: " + ", ".join(served_missed)
    # Cells run before the count existed have none.
    in_limit = "-"
    if "served_in_limit" in ca:
        in_limit = f"{ca['served_in_limit']}/{max(r['served_in_limit'] for r in results.values())}"
    print(f"{cell:<36} {ca['ttft_mean_s']:8.3f} {mean['ttft_mean_s']:8.3f} {mean['policy']:>8} "
          f"{ca['ttft_p99_s']:8.2f} {p99['ttft_p99_s']:8.2f} {p99['policy']:>8} {ca['hit_ratio']:6.3f} "
          f"{hit['hit_ratio']:6.3f} {hit['policy']:>9} {ca['rejected']:5d}/{fewest_refused:<5d} {in_limit:>13} "
          f"{verdict} / {served}")
print(f"{met} of {len(cells)} cells met; {served_met} met comparing TTFT only with policies that refused no more")
each, attainable = each_policy_met(everyone)
print(f"the same rule for every policy against all the others: some policy meets it in {attainable} of "
      f"{len(cells)} cells; " + ", ".join(f"{p} {n}" for p, n in sorted(each.items(), key=lambda x: (-x[1], x[0]))))
pairs = pairwise_met(everyone)
print(f"the rule against one policy alone, cells of {len(cells)} where cache_aware meets it against that policy / "
      "where that policy meets it against cache_aware: "
      + ", ".join(f"{p} {a}/{b}" for p, (a, b) in sorted(pairs.items(), key=lambda x: (x[1][0], x[0]))))
EOF
  # The trace families on Dynamo's mocker engine, beside Dynamo's real router on the same trace.
  if [ "${ROBUSTNESS_DYNAMO:-1}" = 1 ] && dynamo_python=$(scripts/tools/dynamo.sh); then
    dyn_cells=()
    for family in $families; do
      case "$family" in
        trace) path=$trace ;;
        zipf-docs|many-tenants|bursty|agentic-long|long-short) path=$rob/traces/$family.jsonl ;;
        *) continue ;;
      esac
      for replicas in ${ROBUSTNESS_REPLICAS:-8 32}; do
        for scale in ${ROBUSTNESS_SCALES:-1 2 4}; do
          rate_scale=$((scale * replicas / 8))
          cell="mocker-$family-$replicas-x$scale"
          dyn_cells+=("$cell")
          if [ ! -s "$rob/$cell.json" ] || [ "${ROBUSTNESS_FRESH:-0}" = 1 ]; then
            echo "== robustness $cell" >&2
            "$sim" --trace "$path" --replicas "$replicas" --policy all --profile dynamo-mocker --rate-scale "$rate_scale" \
              --json >"$rob/$cell.json.partial"
            mv "$rob/$cell.json.partial" "$rob/$cell.json"
          fi
          dynamo_replay "$rob/$cell.dynamo.json" "$path" "$replicas" "$rate_scale" kv_router
        done
      done
    done
    python3 - "$rob" "${dyn_cells[@]}" <<'EOF'
import json, os, sys
sys.path.insert(0, "bench")
from robustness_verdict import misses
rob, cells = sys.argv[1], sys.argv[2:]
print()
print("robustness on Dynamo's mocker engine (profile dynamo-mocker, no tiers): cache_aware against the best other")
print("simulated policy and against Dynamo 1.6.1's real KV router replaying the same trace (TTFT in s; hit: cached")
print("prompt fraction, Dynamo's counted at first admission; the verdict compares cache_aware with both)")
print(f"{'cell':<30} {'ca mean':>8} {'ca p99':>7} {'ca hit':>6} {'429s':>5} | {'best mean':>16} {'best p99':>16} "
      f"{'best hit':>15} | {'Dynamo mean':>11} {'p99':>6} {'hit':>6} | verdict")
met = 0
for cell in cells:
    results = {r["policy"]: r for r in json.load(open(os.path.join(rob, cell + ".json")))["results"]}
    ca = results.pop("cache_aware")
    mean, p99, hit, _ = misses(ca, list(results.values()))
    dyn = json.load(open(os.path.join(rob, cell + ".dynamo.json")))
    dyn_hit = dyn["first_admission_prefix_cache_reused_ratio"] or dyn["prefix_cache_reused_ratio"]
    real = {"ttft_mean_s": dyn["ttft_mean_s"], "ttft_p99_s": dyn["ttft_p99_s"], "hit_ratio": dyn_hit}
    # The verdict compares with the simulated policies and the real router alike.
    missed = misses(ca, list(results.values()) + [real])[3]
    met += not missed
    print(f"{cell:<30} {ca['ttft_mean_s']:8.3f} {ca['ttft_p99_s']:7.2f} {ca['hit_ratio']:6.3f} {ca['rejected']:5d} | "
          f"{mean['ttft_mean_s']:7.3f} {mean['policy']:>8} {p99['ttft_p99_s']:7.2f} {p99['policy']:>8} "
          f"{hit['hit_ratio']:6.3f} {hit['policy']:>8} | {dyn['ttft_mean_s']:11.3f} {dyn['ttft_p99_s']:6.2f} "
          f"{dyn_hit:6.3f} | {'met' if not missed else 'MISSED: ' + ', '.join(missed)}")
print(f"{met} of {len(cells)} cells met")
EOF
  fi
fi
