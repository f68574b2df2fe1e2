#!/usr/bin/env bash
# check-core-boundary.sh: fails when the synchronous core imports the async shell or global state.
# The core is the gateway's routing (gateway/src/routing/) and prefix-cache doctor (gateway/src/doctor/), the
# agent's block manager and its engine (every file of node-agent/src/engine/ but thread.rs and publisher.rs,
# which run it). It may not name tokio, tonic, hyper, axum or the metrics crate, the agent's Prometheus
# recorder (crate::metrics), or read the clock (Instant::now / SystemTime::now) anywhere but the one real
# clock, engine/clock.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
core=(gateway/src/routing/*.rs gateway/src/doctor/*.rs node-agent/src/block_manager.rs)
for file in node-agent/src/engine/*.rs; do
  case "$file" in */thread.rs | */publisher.rs) continue ;; esac
  core+=("$file")
done
shell='\b(tokio|tonic|hyper|axum|metrics)::|\buse (tokio|tonic|hyper|axum|metrics)\b|crate::metrics\b'
clock='Instant::now|SystemTime::now'
found=$(grep -nE "$shell" "${core[@]}" | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
clocks=$(grep -nE "$clock" "${core[@]}" | grep -v '^node-agent/src/engine/clock.rs:' | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [ -n "$found$clocks" ]; then
  echo "the synchronous core reaches into the async shell, a global recorder or the clock:" >&2
  printf '%s\n' "$found" "$clocks" | sed '/^$/d' >&2
  exit 1
fi
echo "core boundary: ${#core[@]} files import no tokio, tonic, hyper, axum or metrics and read no clock"
