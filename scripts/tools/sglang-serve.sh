#!/usr/bin/env bash
# sglang-serve.sh PORT EVENTS_PORT REPLAY_PORT [EXTRA SGLANG ARGS...]: runs (execs) SGLang's OpenAI-compatible
# server on the CPU, serving SmolLM2-135M-Instruct (scripts/tools/smollm2-hf.sh) as "SmolLM2-135M-Instruct"
# on http://127.0.0.1:PORT, with the radix (prefix) cache in pages of 16 tokens,
# usage.prompt_tokens_details.cached_tokens, Prometheus metrics on GET /metrics, and KV cache events
# published on a ZMQ PUB socket bound to tcp://127.0.0.1:EVENTS_PORT (topic "") with a replay ROUTER socket
# at tcp://127.0.0.1:REPLAY_PORT. It prints nothing of its own on stdout: the server logs on stdout and
# stderr, and is ready when GET /health answers 200 (40 s with the files in the page cache, up to 140 s on a
# cold start). One server takes about 4.5 GB of RAM (PSS of its three processes; 3.2 GB with
# --max-total-tokens 2048). Besides PORT, EVENTS_PORT and REPLAY_PORT it listens on a dozen random
# loopback ports of its own, and on one random port on every interface: the rendezvous store of
# torch.distributed, which binds no particular address.
# Installs SGLang (scripts/tools/sglang.sh) and converts the model on first use. Exit status 1 when it
# cannot be set up.
#
# The CPU engine (SGLANG_USE_CPU_ENGINE=1) runs with PyTorch's native attention in float32 and the
# overlap scheduler off; the few CPU kernels it takes from sglang-kernel, a CUDA-only package, come from the
# pure-PyTorch stand-in in scripts/tools/sglang_cpu_ops, put on PYTHONPATH here.
#
# Environment:
#   KVROUTE_SGLANG_CPUS  the cores the server's OpenMP threads are bound to, e.g. "0" or "0-1" (default:
#                        every core of the NUMA node); give two servers on one machine disjoint lists.
# EXTRA SGLANG ARGS go last and so override the flags below, e.g. `--max-total-tokens 2048` (128 pages of
# 16 tokens, so evictions happen; a prompt must fit in it), `--context-length 1024`, `--max-running-requests 2`.
# --max-total-tokens 32768 caps the KV cache (32768 tokens, 1.4 GB in float32 for this model): without it
# SGLang sizes the cache from the free RAM and takes about 70% of it. A prompt must also fit in the cache: a
# longer one than it (but within the 8192-token context) gets HTTP 200 with an error event in the stream.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ $# -lt 3 ]; then
  echo "usage: scripts/tools/sglang-serve.sh PORT EVENTS_PORT REPLAY_PORT [EXTRA SGLANG ARGS...]" >&2
  exit 2
fi
port="$1"
events_port="$2"
replay_port="$3"
shift 3

venv=$(scripts/tools/sglang.sh) || { echo "sglang-serve: could not set up SGLang" >&2; exit 1; }
model=$(scripts/tools/smollm2-hf.sh) || { echo "sglang-serve: could not make the model" >&2; exit 1; }

export SGLANG_USE_CPU_ENGINE=1
export PYTHONPATH="$PWD/scripts/tools/sglang_cpu_ops${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${KVROUTE_SGLANG_CPUS:-}" ]; then
  export SGLANG_CPU_OMP_THREADS_BIND="$KVROUTE_SGLANG_CPUS"
fi
# No usage reports, no downloads: everything is local.
export DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# SGLang would connect its PUB socket to a concrete host such as 127.0.0.1 ("bind" unset binds only
# wildcard hosts, which listen on every interface): "bind": true binds it to 127.0.0.1 alone. The replay
# ROUTER socket is always bound.
events_config=$(printf '{"publisher":"zmq","endpoint":"tcp://127.0.0.1:%s","bind":true,"replay_endpoint":"tcp://127.0.0.1:%s","topic":""}' \
  "$events_port" "$replay_port")

exec "$venv/bin/python" -m sglang.launch_server \
  --model-path "$model" \
  --served-model-name SmolLM2-135M-Instruct \
  --host 127.0.0.1 \
  --port "$port" \
  --device cpu \
  --attention-backend torch_native \
  --dtype float32 \
  --page-size 16 \
  --max-total-tokens 32768 \
  --disable-overlap-schedule \
  --sleep-on-idle \
  --enable-cache-report \
  --enable-metrics \
  --kv-events-config "$events_config" \
  "$@"
