#!/usr/bin/env bash
# Measures kvroute in front of real vLLM-CPU replicas (deploy/local/up.sh --engine vllm, 2 replicas of
# SmolLM2-135M-Instruct, one core each), in one run on identical work:
#   1. the agent hop: 1-token completions of a cached 2,049-token prompt (2,048 tokens, 16 of vLLM's 128-token
#      blocks, come from the cache), through the gateway (gateway -> agent -> vLLM) against straight to vLLM,
#      interleaved in pairs, p50 and p99 of each;
#   2. routing: kvroute-load's workloads (chat and agent by default) through a cache_aware gateway and a
#      round_robin gateway in front of the same two agents, alternating (cache_aware, round_robin, cache_aware,
#      ...), with both vLLM servers' prefix caches reset before every run: TTFT, end to end, the cached-prompt
#      fraction the engines report (usage.prompt_tokens_details.cached_tokens, passed through by the agents),
#      and the share of the requests each vLLM server finished (its vllm:request_success_total).
#   bench/vllm-compare.sh [--pairs N] [--rounds N] [--workloads "chat agent"] [--sessions N] [--rate R]
#                         [--no-build] [--json FILE]
# vLLM is installed into ~/.cache/kvroute on first use (about 6 GB, 5 minutes); the servers take 4-5 GB of RAM
# each and a minute or two to start. Takes about 10-15 minutes here with warm caches.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=60
rounds=2
workloads="chat agent"
sessions=12
rate=0.3
build=1
json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --workloads) workloads="$2"; shift 2 ;;
    --sessions) sessions="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --json) json="$2"; shift 2 ;;
    *) echo "usage: bench/vllm-compare.sh [--pairs N] [--rounds N] [--workloads \"chat agent\"] [--sessions N] [--rate R] [--no-build] [--json FILE]" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench
fi
source bench/cluster.sh
mkdir -p .run
http_port=8190
rr_port=8191
# up.sh's vLLM servers listen on 8100, 8103, ...; its agents on 50061, 50062, ...
vllm_ports=(8100 8103)
vllm_urls=("http://127.0.0.1:8100" "http://127.0.0.1:8103")
agents="127.0.0.1:50061,127.0.0.1:50062"
# POST /reset_prefix_cache is one of vLLM's development endpoints.
export VLLM_SERVER_DEV_MODE=1
rr_gateway=""
cleanup() {
  [ -n "$rr_gateway" ] && kill "$rr_gateway" 2>/dev/null && wait "$rr_gateway" 2>/dev/null
  stop_cluster
}
trap cleanup EXIT
cluster_wait_secs=900 start_cluster "$http_port" 50191 .run/vllm-compare.log --engine vllm --agents 2 --policy cache_aware
model_dir=$(scripts/tools/smollm2-hf.sh)
target/release/gateway --http-addr "127.0.0.1:$rr_port" --grpc-addr 127.0.0.1:0 --agents "$agents" \
  --tokenizer "$model_dir/tokenizer.json" --policy round_robin >.run/vllm-compare-rr-gateway.log 2>&1 &
rr_gateway=$!
for _ in $(seq 1 240); do
  curl -fsS "http://127.0.0.1:$rr_port/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$rr_port/ready" >/dev/null || { echo "the round_robin gateway is not ready; see .run/vllm-compare-rr-gateway.log" >&2; exit 1; }

echo "== agent hop: $pairs pairs of 1-token completions of a cached 2,049-token prompt" >&2
hop=$(python3 - "$http_port" "$pairs" "${vllm_ports[@]}" <<'PY'
import json, sys, time, urllib.request

gateway, pairs, vllm = int(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
model = "SmolLM2-135M-Instruct"

def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        reply = json.load(answer)
    return time.perf_counter() - started, reply

text = " ".join(f"Paragraph {i}: the archive keeps letters, maps and ledgers from the harbour towns." for i in range(400))
_, tokens = post(vllm[0], "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
prompt = tokens["tokens"][:2049]
assert len(prompt) == 2049, len(prompt)
body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}

def cached(reply):
    return ((reply.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0

# Warm every path: each vLLM server directly, and the gateway (its requests carry a cache salt, so they are
# cached apart from unsalted direct ones).
for port in vllm + [gateway, gateway]:
    post(port, "/v1/completions", body)
through, direct, through_cached, direct_cached = [], [], [], []
for i in range(pairs):
    seconds, reply = post(gateway, "/v1/completions", body)
    through.append(seconds); through_cached.append(cached(reply))
    seconds, reply = post(vllm[i % len(vllm)], "/v1/completions", body)
    direct.append(seconds); direct_cached.append(cached(reply))

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000

def summary(values, cached_tokens):
    return {"p50_ms": round(pct(values, 0.5), 1), "p99_ms": round(pct(values, 0.99), 1),
            "mean_ms": round(sum(values) / len(values) * 1000, 1), "min_cached_tokens": min(cached_tokens)}

result = {"pairs": pairs, "prompt_tokens": len(prompt), "gateway": summary(through, through_cached),
          "direct": summary(direct, direct_cached)}
result["added_p50_ms"] = round(result["gateway"]["p50_ms"] - result["direct"]["p50_ms"], 1)
result["added_p99_ms"] = round(result["gateway"]["p99_ms"] - result["direct"]["p99_ms"], 1)
print(json.dumps(result))
PY
)
echo "$hop" >&2

runs="[]"
for workload in $workloads; do
  for round in $(seq 1 "$rounds"); do
    for policy in cache_aware round_robin; do
      gateway_port=$http_port
      [ "$policy" = round_robin ] && gateway_port=$rr_port
      vllm_reset_caches "${vllm_urls[@]}"
      echo "== $workload, $policy, round $round" >&2
      before=$(vllm_finished "${vllm_urls[@]}")
      report=$(target/release/kvroute-load --url "http://127.0.0.1:$gateway_port" --workload "$workload" --sessions "$sessions" \
        --turns 4 --rate "$rate" --think-ms 500 --max-tokens 16 --duration-secs 300 --seed 7 --json 2>/dev/null)
      after=$(vllm_finished "${vllm_urls[@]}")
      runs=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); b=[int(x) for x in sys.argv[6].split()]; a=[int(x) for x in sys.argv[7].split()]; r.append({"workload":sys.argv[2],"policy":sys.argv[3],"round":int(sys.argv[4]),"report":json.loads(sys.argv[5]),"per_replica":[y-x for x,y in zip(b,a)]}); print(json.dumps(r))' \
        "$runs" "$workload" "$policy" "$round" "$report" "$before" "$after")
    done
  done
done

python3 - "$hop" "$runs" "$json" <<'PY'
import json, sys
hop, runs, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
g, d = hop["gateway"], hop["direct"]
print(f"agent hop, 1-token completions of a cached {hop['prompt_tokens']}-token prompt, {hop['pairs']} interleaved pairs")
print(f"  {'path':<28} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'min cached':>10}")
print(f"  {'gateway -> agent -> vLLM':<28} {g['p50_ms']:>8} {g['p99_ms']:>8} {g['mean_ms']:>8} {g['min_cached_tokens']:>10}")
print(f"  {'client -> vLLM':<28} {d['p50_ms']:>8} {d['p99_ms']:>8} {d['mean_ms']:>8} {d['min_cached_tokens']:>10}")
print(f"  added: p50 {hop['added_p50_ms']} ms, p99 {hop['added_p99_ms']} ms")
print()
print("2 vLLM-CPU replicas, prefix caches reset before every run; per replica: requests each server finished")
print(f"  {'workload':<9} {'policy':<12} {'round':>5} {'ok/req':>8} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'e2e p50':>8} "
      f"{'cached':>7} {'per replica':>12} errors")
for run in runs:
    r = run["report"]
    shares = "/".join(str(n) for n in run["per_replica"])
    print(f"  {run['workload']:<9} {run['policy']:<12} {run['round']:>5} {r['succeeded']:>4}/{r['requests']:<3} "
          f"{r['ttft']['p50_ms']:>9.0f} {r['ttft']['p90_ms']:>7.0f} {r['ttft']['p99_ms']:>7.0f} "
          f"{r['end_to_end']['p50_ms']:>8.0f} {r['cached_fraction']:>7.3f} {shares:>12} {r['errors'] or ''}")
for workload in dict.fromkeys(run["workload"] for run in runs):
    for policy in ["cache_aware", "round_robin"]:
        mine = [run["report"] for run in runs if run["policy"] == policy and run["workload"] == workload]
        prompt = sum(r["prompt_tokens"] for r in mine)
        cached = sum(r["cached_tokens"] for r in mine)
        ok = max(1, sum(r["succeeded"] for r in mine))
        ttft = sum(r["ttft"]["mean_ms"] * r["succeeded"] for r in mine) / ok
        print(f"  {workload:<9} {policy:<12}   all runs: cached fraction {cached / max(1, prompt):.3f}, TTFT mean {ttft:.0f} ms")
if out:
    with open(out, "w") as f:
        json.dump({"hop": hop, "runs": runs}, f, indent=1)
PY
