#!/usr/bin/env bash
# Checks the Kubernetes manifests in deploy/kubernetes without a cluster:
#   - kustomization.yaml lists every manifest of the directory, and only
#     those;
#   - every resource validates, strictly (no unknown field), against the
#     Kubernetes API schemas of KUBERNETES_VERSION (default 1.30.0), with
#     kubernetes-validate (PyPI, pinned; it carries the schemas, so nothing
#     is fetched at check time) in a virtualenv made once per machine:
#     $AGENTRY_K8S_VENV, default ~/.cache/agentry/k8s-venv-1.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="kubernetes-validate==1.37.0"
version="${KUBERNETES_VERSION:-1.30.0}"
venv="${AGENTRY_K8S_VENV:-${HOME:-/tmp}/.cache/agentry/k8s-venv-1}"
stamp="$venv/.agentry-stamp"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$PACKAGE" ]]; then
  echo "==> kubernetes schemas: installing $PACKAGE in $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$PACKAGE"
  echo "$PACKAGE" > "$stamp"
fi

dir=deploy/kubernetes
python3 - "$dir" <<'PY'
import os, re, sys
d = sys.argv[1]
text = open(os.path.join(d, "kustomization.yaml")).read()
block = re.search(r"^resources:\n((?:  - .+\n)+)", text, re.M)
listed = {l.strip()[2:].strip() for l in block.group(1).splitlines()} if block else set()
present = {f for f in os.listdir(d) if f.endswith(".yaml") and f != "kustomization.yaml"}
missing, extra = present - listed, listed - present
if missing or extra:
    sys.exit(f"kustomization.yaml: not listed {sorted(missing)}, listed but absent {sorted(extra)}")
print(f"kustomization.yaml lists all {len(present)} manifests")
PY
files=()
for f in "$dir"/*.yaml; do
  [[ "$(basename "$f")" == kustomization.yaml ]] || files+=("$f")
done
"$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "${files[@]}"
echo "all manifests valid against Kubernetes $version (strict)"
