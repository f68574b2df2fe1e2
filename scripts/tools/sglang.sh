#!/usr/bin/env bash
# sglang.sh: prints the path of a virtual environment under the cache outside the repository
# (${KVROUTE_CACHE:-~/.cache/kvroute}/sglang-0.5.23) with SGLang 0.5.23 (PyPI's sglang==0.5.23) installed
# for serving on the CPU, creating it on first use: about 4 GB of downloads, 6-15 minutes, 7.0 GB on disk
# (3.2 GB of it the CUDA libraries that PyPI's torch requires even where it runs on the CPU).
# The wheel requires CUDA-only packages (sglang-kernel, flashinfer, flash-attn, DeepGEMM, DeepEP, FlashMLA,
# tilelang, cutlass, nvshmem, cuda-python, ...), so it is installed without its dependencies, and its other
# requirements, with PyPI's torch==2.14.1 and torchvision, are installed from the wheel's own metadata less
# those. The CPU kernels that SGLang's CPU engine imports from sglang-kernel come from the pure-PyTorch
# stand-in in scripts/tools/sglang_cpu_ops, which scripts/tools/sglang-serve.sh puts on PYTHONPATH.
# SGLang ships wheels for CPython 3.11 to 3.13 on x86_64 Linux (glibc 2.34 or newer). Needs python3 (3.11 to
# 3.13) with venv; as root with apt-get, installs python3-venv when it is missing. Exit status 1 when it
# cannot be set up.
set -euo pipefail

version=0.5.23
torch=2.14.1
requirement="sglang==$version"
stamp="$requirement torch==$torch v1"
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/sglang-$version"
ops="$(cd "$(dirname "$0")" && pwd)/sglang_cpu_ops"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "$stamp" ]; then
  echo "$venv"
  exit 0
fi
python=$("$(dirname "$0")/venv-python.sh" "sglang: $requirement" 3.11 3.14)
if [ "$(uname -m)" != x86_64 ]; then
  echo "sglang: $requirement has Linux wheels for x86_64 only, this machine is $(uname -m)" >&2
  exit 1
fi

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
work=$(mktemp -d "$(dirname "$venv")/sglang-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "sglang: $1" >&2
  rm -rf "$venv"
  exit 1
}
echo "sglang: installing $requirement with torch==$torch into $venv (about 4 GB, 6-15 minutes) ..." >&2
"$python" -m venv "$venv" >&2 || fail "could not create a virtual environment with $python"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" download --no-deps "$requirement" -d "$work" >&2 || fail "pip download of $requirement failed"
wheel=$(ls "$work"/sglang-"$version"-*.whl)
# The wheel's own requirements, without the optional extras and without the packages that are built for
# CUDA only or do not install on a machine without it. torch stays the wheel's torch==2.14.1, and pip picks
# the torchvision built for it (0.29.2).
"$venv/bin/python" - "$wheel" "$torch" >"$work/requirements.txt" <<'PY' || fail "could not read the requirements of $wheel"
import re, sys, zipfile
wheel, torch = sys.argv[1], sys.argv[2]
skip = {
    "apache-tvm-ffi", "cuda-python", "flash-attn-4", "flashinfer-python", "humming-kernels",
    "nvidia-cutlass-dsl", "nvidia-mathdx", "nvidia-ml-py", "nvshmem4py-cu13", "quack-kernels",
    "sgl-deep-ep", "sgl-deep-gemm", "sgl-flash-mla", "sglang-kernel", "tilelang", "torch-memory-saver",
}
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = z.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req:
        continue
    project = re.match(r"[A-Za-z0-9._-]+", req).group(0)
    if re.sub(r"[-_.]+", "-", project).lower() in skip:
        continue
    if project.lower() == "torch" and req.strip() != f"torch=={torch}":
        sys.exit(f"the wheel asks for {req}, not torch=={torch}")
    print(req)
PY
"${pip[@]}" install -r "$work/requirements.txt" >&2 || fail "could not install the requirements of $requirement"
"${pip[@]}" install --no-deps "$wheel" >&2 || fail "could not install $wheel"
# The CPU kernels come from the stand-in, as scripts/tools/sglang-serve.sh sets it up.
if ! SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$ops" "$venv/bin/python" -c 'import sglang.launch_server, sglang.srt.entrypoints.http_server' \
  >"$work/import.log" 2>&1; then
  tail -n 20 "$work/import.log" >&2
  fail "sglang.launch_server does not import in $venv"
fi
echo "$stamp" >"$venv/.installed"
echo "$venv"
