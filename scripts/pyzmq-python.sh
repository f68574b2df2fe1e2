#!/usr/bin/env bash
# Prints the path of a Python interpreter that has pyzmq (PyPI `pyzmq`, pinned to the version vLLM 0.32
# installs), creating a virtual environment for it in the cache outside the repository on first use. The
# node-agent's ZMTP test plays an engine's PUB and ROUTER sockets with it, so the codec is checked against
# libzmq itself. Exit status 1 when it cannot be set up.
set -euo pipefail

version="27.3.0"
venv=$("$(dirname "$0")/tools/pip-venv.sh" "pyzmq-$version" "pyzmq==$version")
echo "$venv/bin/python"
