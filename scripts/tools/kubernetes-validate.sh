#!/usr/bin/env bash
# Prints the path of a `kubernetes-validate` command (PyPI `kubernetes-validate`, pinned: it checks
# manifests against the Kubernetes JSON schemas it ships, offline), creating a virtual environment for it
# in the cache outside the repository on first use. Exit status 1 when it cannot be set up.
set -euo pipefail

version="1.37.0"
venv=$("$(dirname "$0")/pip-venv.sh" "kubernetes-validate-$version" "kubernetes-validate==$version")
echo "$venv/bin/kubernetes-validate"
