#!/usr/bin/env bash
# Prints the path of a `kubernetes-validate` command (PyPI `kubernetes-validate`, pinned: it checks
# manifests against the Kubernetes JSON schemas it ships, offline), creating a virtual environment for it
# in the cache outside the repository on first use. Exit status 1 when it cannot be set up.
set -euo pipefail

version="1.37.0"
venv="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/kubernetes-validate-$version"
if [ -x "$venv/bin/kubernetes-validate" ] && "$venv/bin/kubernetes-validate" --version >/dev/null 2>&1; then
  echo "$venv/bin/kubernetes-validate"
  exit 0
fi
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "kubernetes-validate.sh: python3 is needed" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! "$python" -m venv "$venv" >&2 || ! "$venv/bin/python" -m pip install --quiet "kubernetes-validate==$version" >&2; then
  echo "kubernetes-validate.sh: could not install kubernetes-validate==$version into $venv" >&2
  rm -rf "$venv"
  exit 1
fi
echo "$venv/bin/kubernetes-validate"
