#!/usr/bin/env bash
# Fuzzes every parser of outside bytes for a bounded time: scripts/fuzz.sh [SECONDS per target, default 60]
# [TARGET...]. Crashing inputs are written to fuzz/artifacts/TARGET/; once fixed, copy them to
# fuzz/regressions/TARGET/, which the tests replay.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
cargo build -j2 --quiet -p kvroute-fuzz
exec target/debug/kvroute-fuzz --seconds "$seconds" "${@:-all}"
