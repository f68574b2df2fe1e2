"""Checks one `helm template` rendering of the kvroute chart (run by deploy/helm-check.sh).

usage: helm-check.py RENDERED.yaml OUT_DIR

- writes the Kubernetes objects to OUT_DIR/objects.yaml for kubernetes-validate, leaving out CRD kinds
  (ServiceMonitor), which it has no schema for; checks instead that a ServiceMonitor's ports exist;
- writes the args of every gateway and node-agent container, with $(VAR) expanded as the kubelet does
  from the container's env and envFrom ConfigMaps, to OUT_DIR/<workload>.<container>.args, one per line;
- checks the args of an engine container beside a node-agent (`vllm`), which no kvroute binary reads,
  against the agent's: the engine's port, KV-event sockets, model directory and name, block size, and the
  flags the agent needs; any container but those and the bundled Redis is refused, so none goes unchecked;
- writes the bundled Redis configuration, when there is one, to OUT_DIR/redis.conf.
Exit status 1 with a message on any problem.
"""

import json
import re
import sys

import yaml

CRD_KINDS = {"ServiceMonitor"}
BINARIES = {"gateway", "node-agent"}
# Engine servers that run beside a node-agent: their args are the engine's, not a kvroute binary's.
ENGINES = {"vllm"}
# The bundled Redis: its configuration is checked by loading redis.conf into a redis-server.
OTHERS = {"redis"}


def fail(message):
    sys.exit(f"helm-check: {message}")


def container_env(container, config_maps):
    env = {}
    for source in container.get("envFrom", []):
        name = source.get("configMapRef", {}).get("name")
        if name not in config_maps:
            fail(f"container {container['name']} takes env from a ConfigMap {name!r} the chart does not render")
        env.update(config_maps[name])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = "pod-0"  # e.g. metadata.name of a StatefulSet's first pod
        elif "secretKeyRef" in var.get("valueFrom", {}):
            env[var["name"]] = "secret"  # e.g. the gateway's admin key
        else:
            fail(f"env {var['name']} of {container['name']}: unsupported source {var}")
    return env


def expand(arg, env, where):
    def substitute(match):
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        if name not in env:
            fail(f"{where}: {arg!r} refers to $({name}), which the container's env does not define")
        return str(env[name])

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", substitute, arg)


def main(rendered, out_dir):
    with open(rendered) as file:
        docs = [doc for doc in yaml.safe_load_all(file) if doc]
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    kept = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in CRD_KINDS:
            print(f"   {kind}/{name}: a CRD kind, not schema-validated; checking its ports instead")
            check_service_monitor(doc, services)
            continue
        kept.append(doc)
        if kind in ("Deployment", "StatefulSet"):
            containers = doc["spec"]["template"]["spec"]["containers"]
            expanded = {}
            for container in containers:
                where = f"{kind}/{name} container {container['name']}"
                if container["name"] in ENGINES or container["name"] in OTHERS:
                    continue  # an engine is checked below, against the agent beside it
                if container["name"] not in BINARIES:
                    fail(f"{where}: neither a kvroute binary nor an engine the check knows")
                env = container_env(container, config_maps)
                args = [expand(arg, env, where) for arg in container.get("args", [])]
                expanded[container["name"]] = args
                with open(f"{out_dir}/{name}.{container['name']}.args", "w") as file:
                    file.write("".join(arg + "\n" for arg in args))
            for container in containers:
                if container["name"] in ENGINES:
                    where = f"{kind}/{name} container {container['name']}"
                    if "node-agent" not in expanded:
                        fail(f"{where}: an engine without a node-agent beside it")
                    check_vllm(where, container.get("args", []), expanded["node-agent"])
    redis_conf = [data["redis.conf"] for data in config_maps.values() if "redis.conf" in data]
    if redis_conf:
        with open(f"{out_dir}/redis.conf", "w") as file:
            file.write(redis_conf[0])
    with open(f"{out_dir}/objects.yaml", "w") as file:
        yaml.safe_dump_all(kept, file)


def flags(args):
    """--name=value and bare --name flags as a dict (a bare flag maps to True)."""
    parsed = {}
    for arg in args:
        name, sep, value = arg.partition("=")
        parsed[name] = value if sep else True
    return parsed


def check_vllm(where, args, agent_args):
    """The vLLM server's args agree with those of the node-agent that presents it (--engine vllm)."""
    engine, agent = flags(args), flags(agent_args)
    if agent.get("--engine") != "vllm":
        fail(f"{where}: the node-agent beside it runs --engine={agent.get('--engine', 'builtin')}, not vllm")
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
        if engine.get(flag) is not True:
            fail(f"{where}: vLLM needs {flag}, which the agent relies on")
    block = int(engine.get("--block-size", 0))
    if block <= 0 or block % 16:
        fail(f"{where}: --block-size={block} is not a multiple of 16")
    url = f"http://{engine.get('--host')}:{engine.get('--port')}"
    if engine.get("--host") != "127.0.0.1" or agent.get("--engine-url") != url:
        fail(f"{where}: vLLM serves {url}, the agent asks --engine-url={agent.get('--engine-url')}")
    config = json.loads(engine.get("--kv-events-config", "{}"))
    if not config.get("enable_kv_cache_events") or config.get("publisher") != "zmq":
        fail(f"{where}: --kv-events-config does not publish KV events over ZMQ: {config}")
    for key, flag in (("endpoint", "--engine-kv-events"), ("replay_endpoint", "--engine-kv-replay")):
        port = str(config.get(key, "")).rpartition(":")[2]
        # vLLM binds only wildcard endpoints (it connects to others); the agent connects on loopback.
        if not str(config.get(key, "")).startswith("tcp://*:") or agent.get(flag) != f"tcp://127.0.0.1:{port}":
            fail(f"{where}: vLLM's {key} {config.get(key)!r} and the agent's {flag}={agent.get(flag)} disagree")
    if engine.get("--model") != agent.get("--model-dir"):
        fail(f"{where}: vLLM loads {engine.get('--model')}, the agent reads --model-dir={agent.get('--model-dir')}")
    if engine.get("--max-num-seqs") != agent.get("--engine-max-running"):
        fail(f"{where}: vLLM runs --max-num-seqs={engine.get('--max-num-seqs')}, the agent reports "
             f"--engine-max-running={agent.get('--engine-max-running')}")
    if engine.get("--served-model-name") != agent.get("--engine-model"):
        fail(f"{where}: vLLM serves {engine.get('--served-model-name')!r}, the agent asks for {agent.get('--engine-model')!r}")
    print(f"   {where}: agrees with its node-agent ({url}, KV events {config['endpoint']}, block size {block})")


def check_service_monitor(monitor, services):
    selector = monitor["spec"]["selector"]
    wanted = selector.get("matchLabels", {})
    component = "app.kubernetes.io/component"
    components = next(
        (e["values"] for e in selector.get("matchExpressions", []) if e["key"] == component and e["operator"] == "In"),
        [wanted.get(component)],
    )
    selected = [
        service
        for service in services.values()
        if {k: v for k, v in wanted.items() if k != component}.items() <= service["metadata"]["labels"].items()
        and service["metadata"]["labels"].get(component) in components
    ]
    if len(selected) != len(components):
        fail(f"the ServiceMonitor selects {len(selected)} Services, expected one per component {components}")
    for endpoint in monitor["spec"]["endpoints"]:
        for service in selected:
            if endpoint["port"] not in {port["name"] for port in service["spec"]["ports"]}:
                fail(f"Service {service['metadata']['name']} has no port {endpoint['port']!r} to scrape")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail(__doc__)
    main(sys.argv[1], sys.argv[2])
