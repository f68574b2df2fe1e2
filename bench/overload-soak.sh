#!/usr/bin/env bash
# Overload soak on the local cluster (deploy/local/up.sh). It measures the cluster's capacity with a closed
# loop, then offers FACTOR times that rate (open-loop Poisson arrivals) for a bounded time, and reports what
# admission control did: how many requests were answered 429 and how fast, whether every accepted request
# completed, the agents' preemptions, and the gateway's resident memory over the run. Files: .run/soak/.
#
#   bench/overload-soak.sh [--minutes 10] [--factor 2] [--agents 2] [--model tiny-random] [--kv-cache-bytes 4MiB]
#                          [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=10
factor=2
agents=2
model="tiny-random"
kv_cache_bytes="4MiB"
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --factor) factor="$2"; shift 2 ;;
    --agents) agents="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --kv-cache-bytes) kv_cache_bytes="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
  esac
done

http_port=18180
out=.run/soak
mkdir -p "$out"
if [ "$build" = 1 ]; then
  cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent -p kvroute-bench
fi

source bench/cluster.sh
sampler=""
stop_all() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  stop_cluster
}
trap stop_all EXIT INT TERM

start_cluster "$http_port" 18151 "$out/cluster.log" --agents "$agents" --model "$model" \
  --kv-cache-bytes "$kv_cache_bytes"
gateway_pid=$(pgrep -f "target/release/gateway --http-addr 127.0.0.1:$http_port" | head -n 1)

load=(target/release/kvroute-load --url "http://127.0.0.1:$http_port" --workload rag --turns 1 --max-tokens 32 --json)
echo "== capacity: closed loop, $((agents * 8)) at once, 60 s" >&2
"${load[@]}" --sessions 100000 --max-requests 100000 --concurrency $((agents * 8)) --duration-secs 60 \
  >"$out/capacity.json" 2>/dev/null
rate=$(python3 -c "import json; r = json.load(open('$out/capacity.json')); print(round($factor * r['succeeded'] / r['seconds'], 2))")
seconds=$((minutes * 60))
sessions=$(python3 -c "print(int($rate * $seconds * 1.2) + 100)")

echo "== overload: $rate requests/s (${factor}x capacity), Poisson, $minutes min" >&2
( while kill -0 "$gateway_pid" 2>/dev/null; do
    echo "$(date +%s) $(awk '/VmRSS/ {print $2}' "/proc/$gateway_pid/status")"
    sleep 5
  done ) >"$out/gateway-rss-kib.txt" &
sampler=$!
"${load[@]}" --sessions "$sessions" --max-requests "$sessions" --rate "$rate" --duration-secs "$seconds" \
  --seed 2 >"$out/overload.json" 2>/dev/null
for i in $(seq 0 $((agents - 1))); do
  curl -fsS "http://127.0.0.1:$((9101 + i))/metrics" >"$out/agent-$i.metrics"
done
curl -fsS "http://127.0.0.1:$http_port/metrics" >"$out/gateway.metrics"

python3 - "$out" "$agents" "$rate" <<'PY'
import json, sys
out, agents, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
capacity = json.load(open(f"{out}/capacity.json"))
run = json.load(open(f"{out}/overload.json"))
def metric(path, name):
    total = 0.0
    for line in open(path):
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.split()[-1])
    return total
preemptions = sum(metric(f"{out}/agent-{i}.metrics", "kvroute_agent_preemptions_total") for i in range(agents))
finished = sum(metric(f"{out}/agent-{i}.metrics", "kvroute_agent_requests_finished_total") for i in range(agents))
rss = [int(line.split()[1]) for line in open(f"{out}/gateway-rss-kib.txt") if len(line.split()) == 2]
errors = dict(run["errors"])
rejected = errors.pop("http-429", 0)
print(f"capacity (closed loop): {capacity['succeeded'] / capacity['seconds']:.1f} requests/s, "
      f"TTFT p50 {capacity['ttft']['p50_ms']:.0f} ms")
print(f"offered: {rate} requests/s for {run['seconds']:.0f} s: {run['requests']} requests")
print(f"accepted and completed: {run['succeeded']}; answered 429: {rejected} "
      f"(p50 {run['rejections']['p50_ms']:.1f} ms, p99 {run['rejections']['p99_ms']:.1f} ms); other errors: {errors or 'none'}")
print(f"accepted: TTFT p50 {run['ttft']['p50_ms']:.0f} ms, p99 {run['ttft']['p99_ms']:.0f} ms; "
      f"end to end p99 {run['end_to_end']['p99_ms']:.0f} ms")
print(f"agents: {finished:.0f} requests finished, {preemptions:.0f} preemptions")
if rss:
    print(f"gateway RSS: {min(rss) / 1024:.1f} MiB min, {max(rss) / 1024:.1f} MiB max, {rss[-1] / 1024:.1f} MiB at the end "
          f"({len(rss)} samples, every 5 s)")
PY
