# Sourced by the bench scripts that drive a local cluster (and by those that drive vLLM servers, for
# vllm_finished and vllm_reset_caches): `start_cluster HTTP_PORT GRPC_PORT LOG [UP.SH ARGS...]`
# starts deploy/local/up.sh (already built binaries) in the background and returns once its gateway is ready,
# exiting the script if it is not (it waits $cluster_wait_secs, default 120, for the gateway to be ready); `stop_cluster` stops it and every process it started.

cluster=""

start_cluster() {
  local http_port="$1" grpc_port="$2" log="$3"
  shift 3
  deploy/local/up.sh "$@" --http-port "$http_port" --grpc-port "$grpc_port" --no-build >"$log" 2>&1 &
  cluster=$!
  for _ in $(seq 1 $((${cluster_wait_secs:-120} * 2))); do
    curl -fsS "http://127.0.0.1:$http_port/ready" >/dev/null 2>&1 && return 0
    kill -0 "$cluster" 2>/dev/null || { echo "the cluster did not start; see $log" >&2; exit 1; }
    sleep 0.5
  done
  echo "the cluster is not ready; see $log" >&2
  exit 1
}

stop_cluster() {
  if [ -n "$cluster" ]; then
    kill -TERM "$cluster" 2>/dev/null || true
    wait "$cluster" 2>/dev/null || true
    cluster=""
  fi
}

# Requests each vLLM server at the URLs "$@" has finished (its vllm:request_success_total), space-separated.
vllm_finished() {
  local url
  for url in "$@"; do
    curl -fsS "$url/metrics" | awk '/^vllm:request_success_total\{/ { n += $NF } END { printf "%d ", n }'
  done
}

# Empties the prefix caches of the vLLM servers at the URLs "$@" (POST /reset_prefix_cache, one of vLLM's
# development endpoints: the servers need VLLM_SERVER_DEV_MODE=1). vLLM publishes the reset's KV event
# (AllBlocksCleared) only with its next engine step, so each server then answers a 1-token completion of a
# prompt shorter than a block (it caches nothing), and routers that learn from those events (kvroute,
# vllm-router kv_aware) get a second to take it in: otherwise they start the next run believing the
# servers still hold what they held before the reset.
vllm_reset_caches() {
  local url model
  for url in "$@"; do
    curl -fsS -X POST "$url/reset_prefix_cache" >/dev/null
  done
  for url in "$@"; do
    model=$(curl -fsS "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    curl -fsS -o /dev/null -H 'Content-Type: application/json' \
      -d "{\"model\":\"$model\",\"prompt\":\"Hello\",\"max_tokens\":1}" "$url/v1/completions"
  done
  sleep 1
}
