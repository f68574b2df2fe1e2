#!/usr/bin/env bash
# kvroute's local demo. The full cluster (redis + node-agents + gateway) is not
# wired up yet: for now this builds the gateway and shows the block-hash chain
# of a sample prompt with the built-in tokenizer, the contract every replica
# and gateway share.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release -p kvroute-gateway --bin gateway --quiet
prompt="You are a helpful assistant. Stable content first, variable content last: a timestamp at the top of a system prompt changes every block after it."
echo "prompt: $prompt"
echo "block hashes (model tiny-random, global scope, 16-token blocks):"
target/release/gateway hash --model tiny-random --block-size 16 --text "$prompt"
echo "same prompt, tenant scope t:acme:"
target/release/gateway hash --model tiny-random --scope t:acme --block-size 16 --text "$prompt"
