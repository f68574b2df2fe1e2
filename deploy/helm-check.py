"""Checks one `helm template` rendering of the kvroute chart (run by deploy/helm-check.sh).

usage: helm-check.py RENDERED.yaml OUT_DIR

- writes the Kubernetes objects to OUT_DIR/objects.yaml for kubernetes-validate, leaving out CRD kinds
  (ServiceMonitor), which it has no schema for; checks instead that a ServiceMonitor's ports exist;
- writes the args of every gateway and node-agent container, with $(VAR) expanded as the kubelet does
  from the container's env and envFrom ConfigMaps, to OUT_DIR/<workload>.<container>.args, one per line;
- writes the bundled Redis configuration, when there is one, to OUT_DIR/redis.conf.
Exit status 1 with a message on any problem.
"""

import re
import sys

import yaml

CRD_KINDS = {"ServiceMonitor"}
BINARIES = {"gateway", "node-agent"}


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
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["name"] not in BINARIES:
                    continue
                where = f"{kind}/{name} container {container['name']}"
                env = container_env(container, config_maps)
                args = [expand(arg, env, where) for arg in container.get("args", [])]
                with open(f"{out_dir}/{name}.{container['name']}.args", "w") as file:
                    file.write("".join(arg + "\n" for arg in args))
    redis_conf = [data["redis.conf"] for data in config_maps.values() if "redis.conf" in data]
    if redis_conf:
        with open(f"{out_dir}/redis.conf", "w") as file:
            file.write(redis_conf[0])
    with open(f"{out_dir}/objects.yaml", "w") as file:
        yaml.safe_dump_all(kept, file)


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
