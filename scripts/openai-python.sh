#!/usr/bin/env bash
# Prints the path of a Python interpreter that has the official OpenAI client library (PyPI `openai`,
# pinned), creating a virtual environment for it in the cache outside the repository on first use.
# The gateway's compatibility test drives the gateway with it. Exit status 1 when it cannot be set up.
set -euo pipefail

version="2.54.0"
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/openai-python-$version"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "openai-python: python3 is needed for the OpenAI client compatibility test" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! "$python" -m venv "$venv" >&2 || ! "$venv/bin/python" -m pip install --quiet "openai==$version" >&2; then
  echo "openai-python: could not install openai==$version into $venv" >&2
  rm -rf "$venv"
  exit 1
fi
echo "$venv/bin/python"
