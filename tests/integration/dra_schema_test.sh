#!/usr/bin/env bash
# Every ResourceSlice `kgpu dra slices` writes — each simulated node profile, static and dynamic
# MIG, the 1.34 and 1.35+ layouts, shared GPUs — is valid against the Kubernetes JSON schemas
# (npm kubernetes-models 5.1.0, resource.k8s.io/v1 with consumable capacity), and so are the
# DeviceClasses of deploy/dra (also checked by deploy.kustomize) and the claim examples of
# docs/dra.md.
#
#   dra_schema_test.sh BIN_DIR SIM_LIB REPO_ROOT WORK_DIR
#
# Exits 77 (skipped) when npm cannot reach its registry for a first install of the schemas.
set -euo pipefail
BIN=$1 SIM_LIB=$2 ROOT=$(cd "$3" && pwd) WORK=$4
rc=0
"$ROOT/tests/deploy/schemas.sh" "$ROOT" "$WORK" || rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || { echo "FAIL: tests/deploy/schemas.sh" >&2; exit 1; }
TMP=$(mktemp -d /tmp/kgpu-dra-schema-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/shares.yaml" <<'YAML'
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: kgpu.io/gpu
      replicas: 4
YAML
n=0
for profile in $("$BIN/kgpu-simctl" profiles | awk '/^[a-z0-9-]+ +[0-9]+ x /{print $1}'); do
  for mode in static dynamic dynamic-1.34 shares; do
    case $mode in
      static) flags=() ;;
      dynamic) flags=(--dynamic-mig) ;;
      dynamic-1.34) flags=(--dynamic-mig --kubernetes-version 1.34) ;;
      shares) flags=(--config-file "$TMP/shares.yaml") ;;
    esac
    KGPU_SIM_NODE=$profile KGPU_SIM_STATE="$TMP/$profile.state" KGPU_NVML_LIBRARY="$SIM_LIB" \
      "$BIN/kgpu" dra slices --node-name "node-$profile" "${flags[@]}" >"$TMP/list.json" ||
      { echo "FAIL: kgpu dra slices ($profile, $mode)" >&2; exit 1; }
    python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["items"], open(sys.argv[2], "w"))' \
      "$TMP/list.json" "$TMP/$profile-$mode.json"
    node "$WORK/npm/validate.mjs" "$TMP/$profile-$mode.json" "$profile ($mode)"
    n=$((n + 1))
  done
done
[ "$n" -ge 16 ] || { echo "FAIL: only $n profile/mode combinations ran" >&2; exit 1; }
# The claim examples of docs/dra.md (```yaml blocks).
python3 - "$ROOT/docs/dra.md" "$TMP/examples.json" <<'PY'
import json, re, sys, yaml
text = open(sys.argv[1]).read()
docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block) if d]
if len(docs) < 3:
    sys.exit(f"docs/dra.md has {len(docs)} example objects; expected the claim examples")
json.dump(docs, open(sys.argv[2], "w"))
print(f"{len(docs)} example objects in docs/dra.md")
PY
node "$WORK/npm/validate.mjs" "$TMP/examples.json" "docs/dra.md examples"
echo "dra_schema_test: PASS ($n slice sets)"
