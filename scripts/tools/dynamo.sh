#!/usr/bin/env bash
# dynamo.sh: prints the python of a virtual environment under the cache outside the repository
# (${KVROUTE_CACHE:-~/.cache/kvroute}/dynamo) holding NVIDIA Dynamo 1.6.1 from PyPI, for replaying traces
# through the real Dynamo KV router and its mocker engines offline (bench/dynamo-replay.py). Creates it on
# first use: about 80 MB of wheels, 285 MB on disk, about 10 s.
# ai-dynamo and ai-dynamo-runtime are installed without their dependencies: ai-dynamo declares aisimulate,
# a stub that downloads its real package from an index outside PyPI, and a serving stack (transformers,
# kubernetes, redis, aiohttp, ...) that offline replay never imports. `dynamo.replay.run_trace_replay`
# needs only the runtime's native module (which embeds the router and the mocker) and typing_extensions.
# Needs python3 (3.10 to 3.14) with venv; as root with apt-get, installs python3-venv when it is missing.
# Exit status 1 when it cannot be set up.
set -euo pipefail

requirements=("ai-dynamo==1.6.1" "ai-dynamo-runtime==1.6.1" "typing-extensions==4.16.0")
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/dynamo"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "${requirements[*]}" ]; then
  echo "$venv/bin/python"
  exit 0
fi
python=$("$(dirname "$0")/venv-python.sh" "dynamo: ${requirements[*]}" 3.10 3.15)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
fail() {
  echo "dynamo: $1" >&2
  rm -rf "$venv"
  exit 1
}
echo "dynamo: installing ${requirements[*]} into $venv (about 80 MB, about 10 s) ..." >&2
"$python" -m venv "$venv" >&2 || fail "could not create a virtual environment with $python"
"$venv/bin/python" -m pip --quiet --disable-pip-version-check install --no-deps "${requirements[@]}" >&2 ||
  fail "pip install --no-deps ${requirements[*]} failed"
# A replay of the 16-request trace shipped in the package: the import and the native router and mocker.
DYN_LOG=error "$venv/bin/python" - >&2 <<'PY' || fail "dynamo.replay does not run in $venv"
import pathlib, dynamo.replay
from dynamo.replay import run_trace_replay
trace = pathlib.Path(dynamo.replay.__file__).parent / "tests" / "data" / "mooncake_tiny.jsonl"
report = run_trace_replay([str(trace)], num_workers=2, router_mode="kv_router", trace_block_size=512)
assert report.summary["completed_requests"] == report.summary["num_requests"] > 0, report.summary
PY
echo "${requirements[*]}" >"$venv/.installed"
echo "$venv/bin/python"
