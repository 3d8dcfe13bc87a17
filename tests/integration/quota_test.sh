#!/usr/bin/env bash
# deploy/quota and `kgpu quota` against the API server stand-in (its quota and LimitRange admission):
# the example quotas load; a pod over team-a's quota is refused with the apiserver's message; a
# two-share pod with a CPU-only sidecar is charged exactly its total memory; `kgpu quota` prints
# used vs hard with GPU-equivalents from the nodes' inventory annotations; `kgpu quota plan`
# divides that inventory, its quotas load and never add up to more than the cluster has; bad
# --shares values exit 1 with the message, a missing --shares exits 2; -n naming a namespace that
# does not exist exits 1, one that cannot be a namespace name 2, and a user who may not read
# namespaces gets the report with a note.
#   quota_test.sh KGPU FAKE_APISERVER REPO_ROOT
set -euo pipefail
kgpu=$1 fake=$2 root=$3
work=$(mktemp -d /tmp/kgpu-quota-XXXXXX)
pid="" rbac_pid=""
cleanup() {
  for p in $pid $rbac_pid; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Nodes: 4 whole A100s, one A100 in MIG mode (7x 1g.10gb), two sharing GPUs (80 and 40 GB).
python3 - "$work/nodes.json" <<'PY'
import json, sys
def inv(node, gpus):
    out = []
    for i, g in enumerate(gpus):
        e = {"i": i, "uuid": f"GPU-{node}-{i}", "model": g.get("model", "NVIDIA A100-SXM4-80GB"),
             "memMiB": g.get("mem", 81920), "numa": 0, "health": "ok"}
        if "slots" in g: e["slots"] = g["slots"]
        if "mig" in g:
            e["mig"] = [{"uuid": f"MIG-{node}-{i}-{k}", "profile": p, "gi": k, "ci": 0, "memMiB": 9984}
                        for k, p in enumerate(g["mig"])]
        out.append(e)
    return json.dumps({"v": 1, "gpus": out, "nvlinkIslands": [], "pcieIslands": [], "migStrategy": "mixed",
                       "sharing": {"mode": "none"}})
nodes = [("whole", [{}] * 4), ("mig", [{"mig": ["1g.10gb"] * 7}]),
         ("share", [{"slots": 16}, {"slots": 16, "mem": 40960, "model": "NVIDIA A100-PCIE-40GB"}])]
with open(sys.argv[1], "w") as f:
    for name, gpus in nodes:
        f.write(json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                "annotations": {"kgpu.io/gpu-inventory": inv(name, gpus)}}, "status": {"capacity": {"cpu": "8"}}}) + "\n")
PY
q=$root/deploy/quota
"$fake" --preload "$work/nodes.json" --preload "$q/namespaces.yaml" --preload "$q/team-a-whole-gpus.yaml" \
  --preload "$q/team-b-mig.yaml" --preload "$q/team-c-shares.yaml" --preload "$q/mig-multi-tenant.yaml" \
  --kubeconfig-out "$work/kc" --port-file "$work/port" >"$work/api.log" 2>&1 &
pid=$!
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { cat "$work/api.log" >&2; fail "the stand-in did not start with deploy/quota preloaded"; }
api="http://127.0.0.1:$(cat "$work/port")"
post() {  # post NAMESPACE JSON -> the response body
  curl -sS -X POST -H 'Content-Type: application/json' --data "$2" "$api/api/v1/namespaces/$1/pods"
}
pod() {  # pod NAME LIMITS_JSON [EXTRA_CONTAINERS_JSON]
  echo "{\"metadata\":{\"name\":\"$1\"},\"spec\":{\"containers\":[{\"name\":\"main\",\"image\":\"cuda\",\"resources\":{\"limits\":$2}}${3:+,$3}]}}"
}

out=$(post team-a "$(pod whole-1 '{"nvidia.com/gpu":"8"}')")
grep -q '"phase":"Pending"' <<<"$out" || fail "whole-1 was not admitted: $out"
out=$(post team-a "$(pod whole-2 '{"nvidia.com/gpu":"1"}')")
grep -qF 'pods \"whole-2\" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8' <<<"$out" \
  || fail "over-quota pod: $out"
echo "ok: over quota refused"
out=$(post team-a "$(pod shares '{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"8000"}')")
# (quantities canonical, as kube-apiserver prints them: 8000 is 8k)
grep -qF 'exceeded quota: gpu, requested: requests.kgpu.io/gpu=1,requests.kgpu.io/gpu-memory=8k, used: requests.kgpu.io/gpu=0,requests.kgpu.io/gpu-memory=0, limited: requests.kgpu.io/gpu=0,requests.kgpu.io/gpu-memory=0' <<<"$out" \
  || fail "team-a's closed shares: $out"
# Two shares of 10000 MiB (20000 in total) and a sidecar the LimitRange gives "0".
out=$(post team-c "$(pod share-1 '{"kgpu.io/gpu":"2","kgpu.io/gpu-memory":"20000","kgpu.io/gpu-cores":"60"}' '{"name":"sidecar","image":"busybox"}')")
grep -q '"phase":"Pending"' <<<"$out" || fail "share-1 was not admitted: $out"
out=$(post team-c "$(pod share-2 '{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"12000"}')")
grep -q '"phase":"Pending"' <<<"$out" || fail "share-2 was not admitted: $out"
used=$(curl -sS "$api/api/v1/namespaces/team-c/resourcequotas/gpu" | python3 -c 'import json,sys; u=json.load(sys.stdin)["status"]["used"]; print(u["requests.kgpu.io/gpu-memory"], u["requests.kgpu.io/gpu"], u["requests.kgpu.io/gpu-cores"])')
[ "$used" = "32k 3 60" ] || fail "team-c used (memory shares cores): '$used', want '32k 3 60' (canonical)"
echo "ok: shares counted exactly: $used"

"$kgpu" quota --kubeconfig "$work/kc" -n team-c >"$work/table" || fail "kgpu quota: $(cat "$work/table")"
cat >"$work/want" <<'TXT'
GPU-equivalents: whole GPU = 1; MIG = compute slices / the GPU's (7 on A100/H100/H200, 4 on A30); share memory / 40960 MiB (NVIDIA A100-PCIE-40GB on node share, the smallest GPU serving shares, of 2 models)
NAMESPACE  QUOTA  RESOURCE                         USED   HARD    GPU-EQ USED  GPU-EQ HARD
team-c     gpu    requests.nvidia.com/gpu          0      0       0.00         0.00
team-c     gpu    requests.nvidia.com/mig-1g.10gb  0      0       0.00         0.00
team-c     gpu    requests.nvidia.com/mig-2g.20gb  0      0       0.00         0.00
team-c     gpu    requests.nvidia.com/mig-3g.40gb  0      0       0.00         0.00
team-c     gpu    requests.kgpu.io/gpu             3      16      -            -
team-c     gpu    requests.kgpu.io/gpu-memory      32000  163840  0.78         4.00
team-c     gpu    requests.kgpu.io/gpu-cores       60     200     -            -
team-c     (all)  GPU-equivalents                                 0.78         4.00
cluster: 3 nodes with a GPU inventory: 4 whole GPUs, 7 MIG instances, 2 GPUs serving shares (122880 MiB) = 8.00 GPU-equivalents
note: MIG profile 2g.20gb is on no node's inventory: its GPU-equivalents assume a GPU of 7 slices
note: MIG profile 3g.40gb is on no node's inventory: its GPU-equivalents assume a GPU of 7 slices
TXT
diff -u "$work/want" "$work/table" || fail "kgpu quota -n team-c output differs"
echo "ok: kgpu quota table"
"$kgpu" quota --kubeconfig "$work/kc" --json >"$work/all.json"
python3 - "$work/all.json" <<'PY' || fail "kgpu quota --json"
import json, sys
d = json.load(open(sys.argv[1]))
ns = {n["namespace"]: n for n in d["namespaces"]}
assert sorted(ns) == ["team-a", "team-b", "team-c", "tenant-1", "tenant-2"], sorted(ns)
assert (ns["team-a"]["gpuEquivalentsUsed"], ns["team-a"]["gpuEquivalentsHard"]) == (8, 8), ns["team-a"]
b = {r["resource"]: r for r in ns["team-b"]["quotas"][0]["resources"]}
assert abs(b["requests.nvidia.com/mig-1g.10gb"]["gpuEquivalentsHard"] - 4 / 7) < 1e-12, b
assert b["requests.kgpu.io/gpu"]["gpuEquivalentsHard"] is None
assert abs(ns["tenant-1"]["gpuEquivalentsHard"] - 2) < 1e-12, ns["tenant-1"]
assert d["capacity"]["gpuEquivalents"] == 8 and d["reference"]["shareMemoryMiB"] == 40960, d["capacity"]
PY
echo "ok: kgpu quota --json"

# -n names a namespace that must exist: the apiserver lists the quotas of a missing namespace (or of
# a name no namespace can have) as an empty list, which must not read as "no GPU quota there".
quota_n() {  # quota_n RC MESSAGE KUBECONFIG ARGS...: stdout and stderr in $work/out
  local want=$1 msg=$2 kc=$3 rc=0
  shift 3
  "$kgpu" quota --kubeconfig "$kc" "$@" >"$work/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "kgpu quota $*: exit $rc, want $want: $(cat "$work/out")"
  grep -qF -- "$msg" "$work/out" || fail "kgpu quota $*: $(cat "$work/out"), want '$msg'"
}
quota_n 1 "kgpu quota: -n/--namespace: namespace team-zz not found (kubectl get namespaces lists them)" "$work/kc" -n team-zz
quota_n 1 "kgpu quota: -n/--namespace: namespace tem-c not found; did you mean team-c?" "$work/kc" -n tem-c --json
[ "$(grep -c . "$work/out")" = 1 ] || fail "kgpu quota -n tem-c --json wrote more than its error: $(cat "$work/out")"
quota_n 2 "kgpu quota: -n/--namespace: 'TEAM-A' is not a namespace name: a lowercase RFC 1123 label (at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit); did you mean 'team-a'?" "$work/kc" -n TEAM-A
quota_n 2 "'team_a' is not a namespace name" "$work/kc" -n team_a
# A namespace that exists without a GPU quota is still an empty report, not an error.
quota_n 0 "no ResourceQuota names a GPU resource" "$work/kc" -n default
quota_n 0 "team-c     (all)  GPU-equivalents" "$work/kc" -n team-c
echo "ok: kgpu quota -n: a missing or malformed namespace"

# A user who may list nodes and quotas but not read Namespace objects (a namespace-scoped Role
# cannot grant it) still gets the report; an empty one says the namespace could not be checked.
cat >"$work/rbac.yaml" <<'YAML'
users:
  quota-reader:
    - {verbs: [get, list], resources: [nodes, resourcequotas]}
YAML
"$fake" --token admin-token=admin --token reader-token=quota-reader --rbac "$work/rbac.yaml" \
  --preload "$work/nodes.json" --preload "$q/namespaces.yaml" --preload "$q/team-c-shares.yaml" \
  --kubeconfig-out "$work/kc-rbac" --port-file "$work/port-rbac" >"$work/api-rbac.log" 2>&1 &
rbac_pid=$!
for _ in $(seq 300); do [ -s "$work/port-rbac" ] && break; sleep 0.1; done
[ -s "$work/port-rbac" ] || { cat "$work/api-rbac.log" >&2; fail "the stand-in with RBAC did not start"; }
sed 's/admin-token/reader-token/' "$work/kc-rbac" >"$work/kc-reader"
grep -q reader-token "$work/kc-reader" || fail "no token to replace in $(cat "$work/kc-rbac")"
quota_n 0 "team-c     (all)  GPU-equivalents" "$work/kc-reader" -n team-c
if grep -qF "may not exist" "$work/out"; then fail "a namespace with quotas was reported unchecked: $(cat "$work/out")"; fi
quota_n 0 "note: namespace team-zz may not exist (it could not be checked: GET /api/v1/namespaces/team-zz: " \
  "$work/kc-reader" -n team-zz
grep -qF "no ResourceQuota names a GPU resource" "$work/out" || fail "-n team-zz, unchecked: $(cat "$work/out")"
echo "ok: kgpu quota -n without the right to read namespaces"

"$kgpu" quota plan --kubeconfig "$work/kc" --shares team-a=50,team-b=30,team-c=20 >"$work/plan.yaml" || fail "plan failed"
python3 - "$work/plan.yaml" <<'PY' || fail "the plan: $(cat "$work/plan.yaml")"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hard = {d["metadata"]["namespace"]: {k: int(v) for k, v in d["spec"]["hard"].items()} for d in docs}
want = {"team-a": {"requests.nvidia.com/gpu": 2, "requests.nvidia.com/mig-1g.10gb": 4, "requests.kgpu.io/gpu": 16,
                   "requests.kgpu.io/gpu-memory": 61440, "requests.kgpu.io/gpu-cores": 100},
        "team-b": {"requests.nvidia.com/gpu": 1, "requests.nvidia.com/mig-1g.10gb": 2, "requests.kgpu.io/gpu": 10,
                   "requests.kgpu.io/gpu-memory": 36864, "requests.kgpu.io/gpu-cores": 60},
        "team-c": {"requests.nvidia.com/gpu": 1, "requests.nvidia.com/mig-1g.10gb": 1, "requests.kgpu.io/gpu": 6,
                   "requests.kgpu.io/gpu-memory": 24576, "requests.kgpu.io/gpu-cores": 40}}
assert hard == want, hard
PY
# The plan's manifests are accepted (replacing the examples' quotas).
python3 -c 'import sys,yaml,json; [print(json.dumps(d)) for d in yaml.safe_load_all(open(sys.argv[1])) if d]' "$work/plan.yaml" |
  while read -r doc; do
    ns=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["metadata"]["namespace"])' "$doc")
    curl -sS -o /dev/null -X DELETE "$api/api/v1/namespaces/$ns/resourcequotas/gpu"
    code=$(curl -sS -o "$work/created" -w '%{http_code}' -X POST -H 'Content-Type: application/json' --data "$doc" \
      "$api/api/v1/namespaces/$ns/resourcequotas")
    [ "$code" = 201 ] || fail "the plan's quota for $ns was refused ($code): $(cat "$work/created")"
  done
echo "ok: kgpu quota plan"
# On a terminal (script(1) gives it one) the plan shows the Nodes it has read, on stderr; with
# --quiet, or writing to a file as above, only the plan.
if grep -q "reading Nodes" "$work/plan.yaml"; then fail "progress in the plan written to a file"; fi
if command -v script >/dev/null; then
  plan=("$kgpu" quota plan --kubeconfig "$work/kc" --shares team-a=50)
  tty_out=$(script -qec "$(printf '%q ' "${plan[@]}")" /dev/null 2>&1)
  grep -q "kgpu quota plan: reading Nodes: [0-9]* nodes, [0-9]* s elapsed" <<<"$tty_out" ||
    fail "quota plan: no progress on a terminal: $tty_out"
  grep -q "requests.nvidia.com/gpu" <<<"$tty_out" || fail "quota plan on a terminal: $tty_out"
  tty_out=$(script -qec "$(printf '%q ' "${plan[@]}" --quiet)" /dev/null 2>&1)
  if grep -q "reading Nodes" <<<"$tty_out"; then fail "quota plan: progress despite --quiet: $tty_out"; fi
  echo "ok: kgpu quota plan progress"
else
  echo "SKIP: quota plan progress on a terminal (no script(1))"
fi

check() {  # check RC MESSAGE ARGS...
  local want=$1 msg=$2; shift 2
  local rc=0
  "$kgpu" quota plan --kubeconfig "$work/kc" "$@" >"$work/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "kgpu quota plan $*: exit $rc, want $want: $(cat "$work/out")"
  grep -qF -- "$msg" "$work/out" || fail "kgpu quota plan $*: $(cat "$work/out"), want '$msg'"
}
check 1 "kgpu quota plan: --shares: the percentages add up to 110 (team-a=60 + team-b=50); they must add up to at most 100 (lower some of them)" --shares team-a=60,team-b=50
check 1 "kgpu quota plan: --shares: 'team-a50' is not NAMESPACE=PERCENT (write e.g. team-a=50)" --shares team-a50
check 1 "--name: 'Bad_Name' is not a ResourceQuota name" --shares team-a=5 --name Bad_Name
check 2 "--shares is required"
echo "ok: bad input"
echo PASS
