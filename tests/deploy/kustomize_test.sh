#!/usr/bin/env bash
# `kubectl kustomize deploy` renders a complete install without any Prometheus Operator object
# (monitoring.coreos.com: it must apply on a cluster without the Operator), deploy plus the
# optional component `monitoring` renders one with the ServiceMonitor, the PrometheusRule and the
# dashboard, and so does the variant with every component (`monitoring`, `node`, `node-labels`,
# `slurm/bridge` and `webhook` too), and so do the example quotas
# (deploy/quota) and the DRA DeviceClasses (deploy/dra); every rendered object is valid against the Kubernetes
# JSON schemas (npm kubernetes-models; monitoring.coreos.com from
# @kubernetes-models/prometheus-operator) and the objects agree with each other
# (tests/deploy/check_rendered.py). The manifests name the image localhost/kgpu:VERSION, a
# placeholder that `images:` in deploy/kustomization.yaml (and deploy/extender's) sets to the
# version; the variants below take that entry as it is. Registered in
# tests/CMakeLists.txt as deploy.kustomize (label kubectl).
#
#   kustomize_test.sh REPO_ROOT WORK_DIR VERSION
#
# WORK_DIR (in the build dir) keeps the npm packages between runs (tests/deploy/schemas.sh).
# Exit 77 (skipped) without kubectl (there is no other kustomize here) and when npm cannot reach
# its registry for a first install.
set -euo pipefail
root=$(cd "$1" && pwd) work=$2 version=$3
here="$root/tests/deploy"
step() { printf '\n== %s\n' "$*"; }
fail() { echo "kustomize_test: FAIL: $*" >&2; exit 1; }

if ! command -v kubectl >/dev/null; then
  echo "kustomize_test: SKIPPED: kubectl not installed (it renders deploy/ with kubectl kustomize)"
  exit 77
fi

step "the second kube-scheduler's version is one setting: images: in deploy/extender/kustomization.yaml"
sched_tag=$(python3 -c 'import sys, yaml
k = yaml.safe_load(open(sys.argv[1]))
print(next((i.get("newTag", "") for i in k.get("images", []) if i["name"] == "registry.k8s.io/kube-scheduler"), ""))' \
  "$root/deploy/extender/kustomization.yaml")
[ -n "$sched_tag" ] || fail "deploy/extender/kustomization.yaml: no images: entry for registry.k8s.io/kube-scheduler"
pinned=$(grep -rnE 'image: *registry.k8s.io/kube-scheduler:' "$root/deploy" --include='*.yaml' || true)
[ -z "$pinned" ] || fail "a manifest pins kube-scheduler's version itself (set images: instead):
$pinned"
rendered=$(kubectl kustomize "$root/deploy/extender") || fail "kubectl kustomize deploy/extender"
grep -qE "image: registry.k8s.io/kube-scheduler:$sched_tag\$" <<<"$rendered" ||
  fail "the rendered kgpu-scheduler does not run registry.k8s.io/kube-scheduler:$sched_tag"
echo "registry.k8s.io/kube-scheduler:$sched_tag"

step "npm packages ($(node --version 2>/dev/null), npm $(npm --version 2>/dev/null))"
rc=0
"$here/schemas.sh" "$root" "$work" || rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "tests/deploy/schemas.sh (above)"

step "the manifests name the image by the placeholder localhost/kgpu:VERSION, set by images:"
bad=$(grep -rnE '^\s*(- )?image: *localhost/' "$root/deploy" --include='*.yaml' | grep -vE 'image: *localhost/kgpu(-slurm-bridge)?:VERSION$' || true)
[ -z "$bad" ] || fail "a manifest names a kgpu image other than by the placeholder (set the tag in images: instead):
$bad"
images_block=$(python3 - "$root/deploy/kustomization.yaml" "$version" <<'PY'
import sys, yaml
k = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
images = {i["name"]: i for i in k.get("images", [])}
for n in ("localhost/kgpu", "localhost/kgpu-slurm-bridge"):
    if images.get(n, {}).get("newTag") != sys.argv[2]:
        sys.exit(f"deploy/kustomization.yaml: images: has no {n} with newTag {sys.argv[2]} (project(VERSION))")
print(yaml.safe_dump({"images": k["images"]}, sort_keys=False), end="")
PY
) || fail "deploy/kustomization.yaml's images: (above)"
echo "$images_block"

# The variant: every component, `node` and `node-labels` after the ones they build on, and the
# Slurm bridge (deploy/slurm/bridge) and the admission webhook (deploy/webhook). Kustomize
# wants paths relative to the kustomization.
variant="$work/variant-all"
mkdir -p "$variant"
rel=$(realpath --relative-to="$variant" "$root/deploy")
cat >"$variant/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel/namespace
components:
  - $rel/device-plugin
  - $rel/exporter
  - $rel/monitoring
  - $rel/node
  - $rel/node-labels
  - $rel/slurm/bridge
  - $rel/webhook
$images_block
YAML

# The default install plus monitoring, as deploy/monitoring/README.md tells to add it: the
# component on top of deploy (deploy/kustomization.yaml leaves it out, for clusters without the
# Prometheus Operator).
monitoring="$work/variant-monitoring"
mkdir -p "$monitoring"
cat >"$monitoring/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel
components:
  - $rel/monitoring
YAML

# The variant for GPU shares through kgpu extender: the plugin labels its own Node and serves
# kgpu.io/gpu slots (node-labels/in-plugin, shares), with the webhook, and the exporter with pod
# labels (exporter/pod-metadata).
shares="$work/variant-shares"
mkdir -p "$shares"
cat >"$shares/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel/namespace
components:
  - $rel/device-plugin
  - $rel/exporter
  - $rel/exporter/pod-metadata
  - $rel/monitoring
  - $rel/node-labels/in-plugin
  - $rel/shares
  - $rel/webhook
$images_block
YAML

for v in default monitoring all shares; do
  dir="$root/deploy"
  [ "$v" = monitoring ] && dir="$monitoring"
  [ "$v" = all ] && dir="$variant"
  [ "$v" = shares ] && dir="$shares"
  step "kubectl kustomize ($v: $dir)"
  kubectl kustomize "$dir" >"$work/$v.yaml" || fail "kubectl kustomize $dir failed"
  grep -E '^kind: ' "$work/$v.yaml" | sort | uniq -c
  step "objects agree ($v)"
  python3 "$here/check_rendered.py" "$work/$v.yaml" "$v" "$version" "$work/$v.json"
  step "Kubernetes JSON schemas ($v)"
  node "$work/npm/validate.mjs" "$work/$v.json" "$v"
done
# deploy/extender: the extender and a second scheduler (its own kustomization, not a component).
step "kubectl kustomize (extender: $root/deploy/extender)"
kubectl kustomize "$root/deploy/extender" >"$work/extender.yaml" || fail "kubectl kustomize $root/deploy/extender failed"
grep -E '^kind: ' "$work/extender.yaml" | sort | uniq -c
step "extender images: make image's (localhost/kgpu:$version, from its images:), kube-scheduler's from registry.k8s.io"
python3 - "$work/extender.yaml" "$version" <<'PY' || fail "deploy/extender runs an image make image does not build"
import sys, yaml
path, version = sys.argv[1:]
bad = []
for o in yaml.safe_load_all(open(path, encoding="utf-8")):
    if not o or o.get("kind") not in ("Deployment", "DaemonSet"):
        continue
    for c in o["spec"]["template"]["spec"].get("containers", []):
        image = c.get("image", "")
        if not image.startswith("registry.k8s.io/kube-scheduler:") and image != f"localhost/kgpu:{version}":
            bad.append(f"{o['kind']} {o['metadata']['name']} container {c['name']}: {image}")
for b in bad:
    print(f"  {b}")
sys.exit(1 if bad else 0)
PY
step "extender certificates (deploy/extender/gen-certs.sh): serving, client, and neither is the other"
rm -rf "$work/extender-certs"
"$root/deploy/extender/gen-certs.sh" --out "$work/extender-certs" --ip 10.96.0.10 ||
  fail "deploy/extender/gen-certs.sh failed"
(
  cd "$work/extender-certs"
  openssl verify -purpose sslserver -CAfile ca.crt tls.crt && openssl verify -purpose sslclient -CAfile ca.crt client.crt
) || fail "gen-certs.sh: a certificate does not verify against its CA for its purpose"
if openssl verify -purpose sslclient -CAfile "$work/extender-certs/ca.crt" "$work/extender-certs/tls.crt" >/dev/null 2>&1; then
  fail "gen-certs.sh: the serving certificate passes as a client certificate"
fi
openssl x509 -in "$work/extender-certs/tls.crt" -noout -ext subjectAltName |
  grep -q "DNS:kgpu-extender.kgpu-system.svc, .*IP Address:10.96.0.10" ||
  fail "gen-certs.sh: the serving certificate does not name the Service and the --ip address"
step "extender: only kube-scheduler may call it, in both documented variants (tests/deploy/check_extender.py)"
python3 "$here/check_extender.py" "$work/extender.yaml" "$root/deploy/extender/kube-scheduler-config.yaml" \
  "$work/extender-certs/kgpu-extender-secrets.yaml" "$work/extender.json" || fail "deploy/extender (above)"
step "Kubernetes JSON schemas (extender, with gen-certs.sh's Secrets)"
node "$work/npm/validate.mjs" "$work/extender.json" extender
# deploy/quota: the example team quotas (not a component of the install).
step "kubectl kustomize (quota: $root/deploy/quota)"
kubectl kustomize "$root/deploy/quota" >"$work/quota.yaml" || fail "kubectl kustomize $root/deploy/quota failed"
grep -E '^kind: ' "$work/quota.yaml" | sort | uniq -c
step "quota objects"
python3 "$here/check_rendered.py" "$work/quota.yaml" quota "$version" "$work/quota.json"
step "Kubernetes JSON schemas (quota)"
node "$work/npm/validate.mjs" "$work/quota.json" quota
# deploy/dra: the DRA DeviceClasses (not a component of the install).
step "kubectl kustomize (dra: $root/deploy/dra)"
kubectl kustomize "$root/deploy/dra" >"$work/dra.yaml" || fail "kubectl kustomize $root/deploy/dra failed"
python3 "$here/check_rendered.py" "$work/dra.yaml" dra "$version" "$work/dra.json"
step "Kubernetes JSON schemas (dra)"
node "$work/npm/validate.mjs" "$work/dra.json" dra

printf '\ndeploy.kustomize: PASS\n'
