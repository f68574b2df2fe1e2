#!/usr/bin/env bash
# pip-venv.sh NAME REQUIREMENT: prints the path of a virtual environment under the cache outside the
# repository (${KVROUTE_CACHE:-~/.cache/kvroute}/NAME) with REQUIREMENT (e.g. `openai==2.54.0`) installed,
# creating it on first use. Exit status 1 when it cannot be set up.
set -euo pipefail

name="$1"
requirement="$2"
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/$name"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "$requirement" ]; then
  echo "$venv"
  exit 0
fi
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "pip-venv: python3 is needed for $requirement" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! "$python" -m venv "$venv" >&2 || ! "$venv/bin/python" -m pip install --quiet "$requirement" >&2; then
  echo "pip-venv: could not install $requirement into $venv" >&2
  rm -rf "$venv"
  exit 1
fi
echo "$requirement" >"$venv/.installed"
echo "$venv"
