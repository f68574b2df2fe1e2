#!/usr/bin/env bash
# Prints the path of a Python interpreter that has the official OpenAI client library (PyPI `openai`,
# pinned), creating a virtual environment for it in the cache outside the repository on first use.
# The gateway's compatibility test drives the gateway with it. Exit status 1 when it cannot be set up.
set -euo pipefail

version="2.54.0"
venv=$("$(dirname "$0")/tools/pip-venv.sh" "openai-python-$version" "openai==$version")
echo "$venv/bin/python"
