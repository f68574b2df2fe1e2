#!/usr/bin/env bash
# venv-python.sh WHAT MIN MAX: prints the path of a python3 whose version is at least MIN and below MAX
# (e.g. 3.11 3.15) and that can create virtual environments; as root with apt-get, installs python3-venv
# when it is missing. WHAT names the caller and what it installs, in the messages. Exit status 1 otherwise.
set -euo pipefail

what="$1"
min="$2"
max="$3"
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "$what: python3 ($min up to $max, excluded) is needed" >&2
  exit 1
fi
version_ok="import sys; low, high = (tuple(map(int, v.split('.'))) for v in sys.argv[1:]); sys.exit(not (low <= sys.version_info[:2] < high))"
if ! "$python" -c "$version_ok" "$min" "$max"; then
  echo "$what: needs python $min up to $max (excluded), $python is $("$python" --version 2>&1)" >&2
  exit 1
fi
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "$what: installing python3-venv" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
      echo "$what: $python still has no venv module after installing python3-venv" >&2
      exit 1
    fi
  else
    echo "$what: $python has no venv module: install python3-venv (e.g. sudo apt-get install python3-venv) and rerun" >&2
    exit 1
  fi
fi
echo "$python"
