#!/usr/bin/env bash
# peers.sh: prints the path of a virtual environment under the cache outside the repository
# (${KVROUTE_CACHE:-~/.cache/kvroute}/peer-routers-...) holding the routers kvroute is measured against, from
# PyPI: vllm-router 0.1.17 (command `vllm-router`) and sglang-router 0.3.2 (command `smg`), both Rust
# binaries behind a thin Python launcher. Creates it on first use (about 55 MB of wheels, 220 MB on disk,
# under a minute). Needs python3 (3.9 to 3.14) with venv; as root with apt-get, installs python3-venv when it
# is missing. Exit status 1 when it cannot be set up.
set -euo pipefail

requirements=("vllm-router==0.1.17" "sglang-router==0.3.2")
name="peer-routers-vllm-router-0.1.17-sglang-router-0.3.2"
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/$name"
if [ -x "$venv/bin/vllm-router" ] && [ -x "$venv/bin/smg" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "${requirements[*]}" ]; then
  echo "$venv"
  exit 0
fi
python=$("$(dirname "$0")/venv-python.sh" "peers: ${requirements[*]}" 3.9 3.15)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
fail() {
  echo "peers: $1" >&2
  rm -rf "$venv"
  exit 1
}
echo "peers: installing ${requirements[*]} into $venv (about 55 MB, under a minute) ..." >&2
"$python" -m venv "$venv" >&2 || fail "could not create a virtual environment with $python"
"$venv/bin/python" -m pip --quiet --disable-pip-version-check install "${requirements[@]}" >&2 ||
  fail "pip install ${requirements[*]} failed"
"$venv/bin/vllm-router" --help >/dev/null 2>&1 || fail "vllm-router does not run in $venv"
"$venv/bin/smg" launch --help >/dev/null 2>&1 || fail "smg (sglang-router) does not run in $venv"
echo "${requirements[*]}" >"$venv/.installed"
echo "$venv"
