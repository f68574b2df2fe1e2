#!/usr/bin/env bash
# Sends N distinct chats of about 400 tokens to a fresh local cluster (deploy/local/up.sh, SmolLM2, 2 agents),
# each twice in a row (the second right after the first answered), and reports the cached tokens of every
# repeat and whether the gateway ever declared a replica unhealthy. A busy replica must not be declared dead
# while it computes exactly the prefix the repeat wants: every repeat should report cached tokens.
#   bench/repeat-cached.sh [--chats N] [--no-build] [UP.SH ARGS...]
# Exits non-zero when a repeat reports no cached tokens or the gateway log says "replica unhealthy".
set -euo pipefail
cd "$(dirname "$0")/.."
chats=20
build=1
up_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --chats) chats="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) up_args+=("$1"); shift ;;
  esac
done
if [ "$build" = 1 ]; then
  cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent
fi
source bench/cluster.sh
http_port=8190
mkdir -p .run
trap stop_cluster EXIT
start_cluster "$http_port" 50191 .run/repeat-cached.log "${up_args[@]}"

status=0
python3 - "$http_port" "$chats" <<'PY' || status=$?
import json, sys, urllib.request

port, chats = int(sys.argv[1]), int(sys.argv[2])
topics = ["harbours", "glaciers", "orchards", "lighthouses", "bridges", "libraries", "markets", "observatories",
          "railways", "vineyards", "canals", "deserts", "monasteries", "reefs", "foundries", "meadows", "archives",
          "volcanoes", "ferries", "bakeries", "quarries", "windmills", "estuaries", "theatres"]

def chat(i):
    topic = topics[i % len(topics)]
    facts = " ".join(f"Fact {n} about {topic} number {i}: they change with the seasons, the light and the people "
                     f"who tend them, and record {n * 7 + i} details of their history." for n in range(12))
    return [{"role": "system", "content": f"You are a careful guide to {topic}. Session {i}."},
            {"role": "user", "content": f"Here are my notes. {facts} Summarise them in one sentence."}]

def send(messages):
    body = json.dumps({"messages": messages, "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        usage = json.load(response)["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

hits = 0
print(f"{'chat':>4} {'prompt':>6} {'first cached':>12} {'repeat cached':>13}")
for i in range(chats):
    messages = chat(i)
    prompt, first = send(messages)
    _, repeat = send(messages)
    hits += repeat > 0
    print(f"{i:>4} {prompt:>6} {first:>12} {repeat:>13}")
print(f"repeats reporting cached tokens: {hits} of {chats}")
sys.exit(0 if hits == chats else 1)
PY
unhealthy=$(grep -c "replica unhealthy" .run/gateway.log || true)
echo "\"replica unhealthy\" in .run/gateway.log: $unhealthy"
[ "$status" = 0 ] && [ "$unhealthy" = 0 ]
