#!/usr/bin/env bash
# Prints the path of `promtool` (Prometheus' checker for rules and /metrics output), installing Debian's
# `prometheus` package with apt-get when it is missing and we are root. Exit status 1 when it cannot.
set -euo pipefail

found=$(command -v promtool || true)
[ -z "$found" ] && [ -x /usr/bin/promtool ] && found=/usr/bin/promtool
if [ -z "$found" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "promtool: missing; install it with 'apt-get install prometheus' (Debian) and rerun" >&2
    exit 1
  fi
  echo "promtool: installing Debian's prometheus package" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  found=/usr/bin/promtool
fi
echo "$found"
