#!/usr/bin/env bash
# vllm-serve.sh PORT EVENTS_PORT REPLAY_PORT [EXTRA VLLM ARGS...]: runs (execs) vLLM's OpenAI-compatible
# server on the CPU, serving SmolLM2-135M-Instruct (scripts/tools/smollm2-hf.sh) as "SmolLM2-135M-Instruct"
# on http://127.0.0.1:PORT, with prefix caching, usage.prompt_tokens_details.cached_tokens, and KV cache
# events published on a ZMQ PUB socket at tcp://127.0.0.1:EVENTS_PORT (topic "") with a replay ROUTER
# socket at tcp://127.0.0.1:REPLAY_PORT. It prints nothing of its own on stdout: the server logs on
# stdout and stderr, and is ready when GET /health answers 200 (about 60 s). One server takes 4-5 GB of RAM.
# Installs vLLM and converts the model on first use. Exit status 1 when it cannot be set up.
#
# Environment:
#   KVROUTE_VLLM_CPUS      the cores the server's OpenMP threads are bound to, one thread each, e.g. "0" or
#                          "0-1" (default: every core it may run on); give two servers on one machine
#                          disjoint lists ("0" and "1").
#   VLLM_CPU_KVCACHE_SPACE the KV cache size in GiB (default 1: 182 blocks of 128 tokens for this model).
#   VLLM_SERVER_DEV_MODE=1 adds vLLM's development endpoints, among them POST /reset_prefix_cache.
# EXTRA VLLM ARGS go last and so override the flags below, e.g. `--num-gpu-blocks-override 24
# --max-model-len 2048` (24 blocks, so evictions happen; the blocks must hold max-model-len), `--max-num-seqs 2`.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ $# -lt 3 ]; then
  echo "usage: scripts/tools/vllm-serve.sh PORT EVENTS_PORT REPLAY_PORT [EXTRA VLLM ARGS...]" >&2
  exit 2
fi
port="$1"
events_port="$2"
replay_port="$3"
shift 3

venv=$(scripts/tools/vllm.sh) || { echo "vllm-serve: could not set up vLLM" >&2; exit 1; }
model=$(scripts/tools/smollm2-hf.sh) || { echo "vllm-serve: could not make the model" >&2; exit 1; }

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# By default every core this process may run on (its affinity, as `taskset` sets it).
cpus="${KVROUTE_VLLM_CPUS:-$("$venv/bin/python" -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')}"
export VLLM_CPU_OMP_THREADS_BIND="$cpus"
# No usage reports, no downloads: everything is local.
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# vLLM binds the PUB endpoint only when it contains "*" or "::" (else it connects to it), and "*" would
# bind every interface: the IPv4-mapped address binds 127.0.0.1 alone. The ROUTER endpoint is always bound.
events_config=$(printf '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://[::ffff:127.0.0.1]:%s","replay_endpoint":"tcp://127.0.0.1:%s","topic":""}' \
  "$events_port" "$replay_port")

exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$model" \
  --served-model-name SmolLM2-135M-Instruct \
  --host 127.0.0.1 \
  --port "$port" \
  --dtype float32 \
  --enforce-eager \
  --enable-prefix-caching \
  --enable-prompt-tokens-details \
  --kv-events-config "$events_config" \
  "$@"
