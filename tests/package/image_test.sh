#!/usr/bin/env bash
# The OCI image that `make image` writes (scripts/make-image.sh), without a container engine:
# built twice from the same packages, the same digest and the same archive files; what skopeo
# sees in both archives (config, entrypoint, user, labels, one layer of under 60 MB); and the image
# unpacked with umoci and run in a chroot as its own user (uid 65532): `kgpu --version` as it
# is, then `kgpu devices`, `kgpu doctor` and `kgpu exporter` on the simulated node with kgpu-sim
# installed into this test's copy only (the image has no NVML: on a node the NVIDIA Container
# Toolkit puts the driver's into the container). Registered in tests/CMakeLists.txt as
# package.image (label package, after package.deb_in_debian12, which builds the packages).
#
#   image_test.sh REPO_ROOT VERSION CACHE_DIR
#
# Needs root (chroot, mount), debootstrap, umoci, skopeo and the Debian mirror; the packages in
# REPO_ROOT/build/release/packages (`make package`).
set -euo pipefail
root=$(cd "$1" && pwd) version=$2 cache=$3
step() { printf '\n== %s\n' "$*"; }
fail() { echo "image_test: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (chroot, mount)"
for tool in umoci skopeo debootstrap python3; do
  command -v "$tool" >/dev/null || fail "$tool not found: run scripts/install-deps.sh"
done
kgpu_deb="$root/build/release/packages/kgpu_${version}_amd64.deb"
sim_deb="$root/build/release/packages/kgpu-sim_${version}_amd64.deb"
[ -s "$kgpu_deb" ] && [ -s "$sim_deb" ] || fail "no packages in $root/build/release/packages: run make package"

work=$(mktemp -d "${TMPDIR:-/tmp}/kgpu-image-test.XXXXXX")
cleanup() { rm -rf --one-file-system "$work"; }
trap cleanup EXIT
name=localhost/kgpu
oci_tar=kgpu-$version.oci.tar docker_tar=kgpu-$version.docker.tar

step "scripts/make-image.sh, twice"
t0=$SECONDS
"$root/scripts/make-image.sh" "$root" "$version" "$work/a" "$cache"
echo "first build took $((SECONDS - t0)) s"
"$root/scripts/make-image.sh" "$root" "$version" "$work/b" "$cache" >"$work/b.log" 2>&1 ||
  { cat "$work/b.log"; fail "the second build failed"; }
a=$work/a b=$work/b

step "reproducible: the same digest and the same archive files"
digest=$(cat "$a/kgpu-$version.digest")
echo "first $digest, second $(cat "$b/kgpu-$version.digest")"
if ! cmp -s "$a/kgpu-$version.digest" "$b/kgpu-$version.digest" || ! cmp -s "$a/$oci_tar" "$b/$oci_tar" ||
  ! cmp -s "$a/$docker_tar" "$b/$docker_tar"; then
  # What differs: the package lists (the mirror moved between the builds?), then the layers' files.
  diff "$a/kgpu-$version.packages" "$b/kgpu-$version.packages" || true
  python3 - "$a/$oci_tar" "$b/$oci_tar" <<'PY' || true
import hashlib, io, json, sys, tarfile
def layer(path):
    t = tarfile.open(path)
    idx = json.load(t.extractfile("index.json"))
    blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1])
    m = json.load(blob(idx["manifests"][0]["digest"]))
    files = {}
    for l in m["layers"]:
        lt = tarfile.open(fileobj=io.BytesIO(blob(l["digest"]).read()), mode="r:gz")
        for e in lt:
            data = hashlib.sha256(lt.extractfile(e).read()).hexdigest()[:16] if e.isfile() else ""
            files[e.name] = (oct(e.mode), e.uid, e.gid, e.size, e.mtime, e.linkname, e.type, data)
    return m, files
ma, fa = layer(sys.argv[1])
mb, fb = layer(sys.argv[2])
print("config:", ma["config"]["digest"], mb["config"]["digest"])
diffs = [n for n in sorted(set(fa) | set(fb)) if fa.get(n) != fb.get(n)]
for n in diffs[:40]:
    print(f"  {n}: {fa.get(n)} / {fb.get(n)}")
print(f"{len(diffs)} entries differ")
PY
  fail "two builds of the same commit differ (above)"
fi
echo "OK: $oci_tar $(sha256sum <"$a/$oci_tar" | cut -c1-16)..., $docker_tar $(sha256sum <"$a/$docker_tar" | cut -c1-16)..."

step "skopeo inspect: the OCI archive and the docker archive"
skopeo inspect "oci-archive:$a/$oci_tar" >"$work/inspect.json"
skopeo inspect --config "oci-archive:$a/$oci_tar" >"$work/config.json"
skopeo inspect --raw "oci-archive:$a/$oci_tar" >"$work/manifest.json"
skopeo inspect --config "docker-archive:$a/$docker_tar" >"$work/docker-config.json"
skopeo inspect --raw "docker-archive:$a/$docker_tar" >"$work/docker-manifest.json"
tar -xOf "$a/$oci_tar" index.json >"$work/index.json"
tar -xOf "$a/$docker_tar" manifest.json >"$work/docker-archive-manifest.json"
expect_epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct)}
python3 - "$work" "$digest" "$version" "$name" "$expect_epoch" <<'PY' || fail "skopeo inspect (above)"
import datetime, json, os, re, sys
work, digest, version, name, epoch = sys.argv[1:]
load = lambda f: json.load(open(os.path.join(work, f)))
inspect, config, manifest = load("inspect.json"), load("config.json"), load("manifest.json")
dconfig, dmanifest, index = load("docker-config.json"), load("docker-manifest.json"), load("index.json")
darchive = load("docker-archive-manifest.json")
created = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
problems = []
def want(what, have, expected):
    if have != expected:
        problems.append(f"{what} is {have!r}, want {expected!r}")
want("Digest", inspect["Digest"], digest)
want("Architecture", inspect["Architecture"], "amd64")
want("Os", inspect["Os"], "linux")
want("number of layers", len(inspect["Layers"]), 1)
want("manifest schemaVersion", manifest["schemaVersion"], 2)
want("config mediaType", manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json")
want("layer mediaType", manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip")
c = config["config"]
want("config User", c.get("User"), "65532:65532")
want("config Entrypoint", c.get("Entrypoint"), ["kgpu"])
want("config Cmd", c.get("Cmd"), ["--help"])
want("config created", config.get("created"), created)
want("history", [h.get("created") for h in config.get("history", [])], [created])
labels = c.get("Labels", {})
want("label title", labels.get("org.opencontainers.image.title"), "kgpu")
want("label version", labels.get("org.opencontainers.image.version"), version)
want("label created", labels.get("org.opencontainers.image.created"), created)
if not re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels.get("org.opencontainers.image.revision", "")):
    problems.append(f"label revision is {labels.get('org.opencontainers.image.revision')!r}, not a commit")
for k in ("source", "description"):
    if not labels.get(f"org.opencontainers.image.{k}"):
        problems.append(f"no label org.opencontainers.image.{k}")
(entry,) = index["manifests"]
want("index digest", entry["digest"], digest)
for k in ("org.opencontainers.image.ref.name", "io.containerd.image.name"):
    want(f"index annotation {k}", entry.get("annotations", {}).get(k), f"{name}:{version}")
# The docker archive: the same config (docker's image ID), the same layer, tagged for docker load.
want("docker archive config", dconfig, config)
want("docker archive config digest", dmanifest["config"]["digest"], manifest["config"]["digest"])
want("docker archive layers", len(dmanifest["layers"]), 1)
want("docker archive RepoTags", [t for m in darchive for t in m.get("RepoTags", [])], [f"{name}:{version}"])
size = manifest["layers"][0]["size"]
print(f"digest {digest}, image ID {manifest['config']['digest']}")
print(f"user {c['User']}, entrypoint {c['Entrypoint']}, cmd {c['Cmd']}, {len(labels)} labels, "
      f"revision {labels.get('org.opencontainers.image.revision')}")
print(f"layer {size / 1e6:.1f} MB compressed")
if size >= 60_000_000:
    problems.append(f"the layer is {size / 1e6:.1f} MB compressed, the goal is under 60 MB")
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
PY
echo "OK"

step "both archives load into containers-storage (what podman load does, and where CRI-O looks)"
store="containers-storage:[vfs@$work/storage/root+$work/storage/run]"
image_id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["digest"].split(":")[1])' "$work/manifest.json")
for archive in "oci-archive:$a/$oci_tar" "docker-archive:$a/$docker_tar"; do
  skopeo copy -q "$archive" "${store}$name:$version" || fail "skopeo copy $archive to containers-storage"
  loaded=$(skopeo inspect --format '{{.Name}}' "${store}$name:$version")
  [ "$loaded" = "$name" ] || fail "$archive loaded as $loaded, not $name"
  loaded_id=$(skopeo inspect --config --raw "${store}$name:$version" | sha256sum | cut -d' ' -f1)
  [ "$loaded_id" = "$image_id" ] || fail "$archive loaded with image ID $loaded_id, not $image_id"
  echo "$archive: $name:$version, image ID ${image_id:0:12}"
done
rm -rf "$work/storage"

step "umoci unpack (as a runtime would)"
skopeo copy -q "oci-archive:$a/$oci_tar" "oci:$work/layout:kgpu"
umoci unpack --image "$work/layout:kgpu" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"
python3 - "$work/bundle/config.json" <<'PY' || fail "the runtime config umoci generates"
import json, sys
p = json.load(open(sys.argv[1]))["process"]
ok = p["args"] == ["kgpu", "--help"] and p["user"]["uid"] == 65532 and p["user"]["gid"] == 65532
print(f"process args {p['args']}, uid {p['user']['uid']}, gid {p['user']['gid']}")
sys.exit(0 if ok else 1)
PY
grep -qx 'kgpu:x:65532:65532::/nonexistent:/usr/sbin/nologin' "$rootfs/etc/passwd" || fail "/etc/passwd has no user kgpu 65532"
[ -x "$rootfs/usr/bin/kgpu" ] || fail "no /usr/bin/kgpu"
[ -d "$rootfs/run/lock" ] && [ -d "$rootfs/tmp" ] && [ "$(stat -c %a "$rootfs/tmp")" = 1777 ] ||
  fail "/run/lock (what /var/lock names) or /tmp (mode 1777) is missing"
[ -z "$(find "$rootfs" -name 'libnvidia-ml*' -print -quit)" ] || fail "the image has an NVML library (it would shadow the driver's)"
[ -z "$(find "$rootfs/var/lib/apt/lists" "$rootfs/var/cache/apt" "$rootfs/var/log" "$rootfs/tmp" -type f -print -quit)" ] ||
  fail "apt lists, downloaded packages, logs or temporary files are left: $(find "$rootfs/var/lib/apt/lists" "$rootfs/var/cache/apt" "$rootfs/var/log" "$rootfs/tmp" -type f | head -5)"
[ -z "$(find "$rootfs/usr/share/doc" -type f -not -name copyright -print -quit)" ] || fail "documentation besides copyright files in /usr/share/doc"
echo "OK: $(du -sh "$rootfs" | cut -f1) unpacked"

cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
cp "$sim_deb" "$rootfs/tmp/kgpu-sim.deb"
cat >"$rootfs/tmp/inside.sh" <<'INSIDE'
#!/bin/bash
set -euo pipefail
fail() { echo "image_test (in the image): FAIL: $*" >&2; exit 1; }
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
# As the image's user, as a pod without runAsUser would.
as_kgpu() { setpriv --reuid=65532 --regid=65532 --clear-groups --no-new-privs "$@"; }
[ "$(as_kgpu id -u):$(as_kgpu id -g)" = "65532:65532" ] || fail "setpriv does not run as 65532"
echo "== kgpu --version (uid 65532, the image as it is)"
as_kgpu kgpu --version | tee /tmp/version.txt
grep -Eq "^kgpu $KGPU_EXPECT_VERSION \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)$" /tmp/version.txt || fail "kgpu --version"
if ldd /usr/bin/kgpu | grep 'not found'; then fail "kgpu needs a library the image lacks"; fi
for lib in libcurl.so.4 libcpp-httplib.so.0.11; do  # dlopened (src/cli/lazy_lib.h)
  ldconfig -p | grep -q "$lib" || fail "the image has no $lib, which kgpu loads for its HTTP clients and servers"
done
as_kgpu kgpu --help >/dev/null || fail "kgpu --help (the image's CMD)"
echo "== apt-get install ./kgpu-sim.deb (the simulated NVML, in this test's copy only)"
export DEBIAN_FRONTEND=noninteractive
apt-get -qq update
apt-get install -y -qq --no-install-recommends /tmp/kgpu-sim.deb >/tmp/apt.log 2>&1 ||
  { tail -30 /tmp/apt.log; fail "apt-get install kgpu-sim failed"; }
export KGPU_NVML_LIBRARY=/usr/lib/kgpu/sim/libnvidia-ml.so.1 KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=/tmp/sim.state
echo "== kgpu devices (uid 65532)"
as_kgpu kgpu devices | tee /tmp/devices.txt
[ "$(grep -c 'H100' /tmp/devices.txt)" -ge 8 ] || fail "kgpu devices does not list the 8 simulated H100s"
echo "== kgpu doctor (uid 65532; GPU 3 lost with kgpu-simctl)"
mkdir -p /tmp/dev
mknod /tmp/dev/nvidiactl c 195 255 && mknod /tmp/dev/nvidia-uvm c 235 0
for i in 0 1 2 3 4 5 6 7; do mknod /tmp/dev/nvidia$i c 195 $i; done
as_kgpu kgpu-simctl lose 3
rc=0
as_kgpu kgpu doctor --dev-root /tmp >/tmp/doctor.txt 2>&1 || rc=$?
cat /tmp/doctor.txt
grep -q '\[PASS\] NVML library' /tmp/doctor.txt || fail "doctor does not find the NVML library"
grep -q '\[PASS\] .*8 GPU' /tmp/doctor.txt || fail "doctor does not enumerate 8 GPUs"
grep -q '\[FAIL\].*GPU 3' /tmp/doctor.txt || fail "doctor does not FAIL on the lost GPU 3"
[ "$rc" -eq 1 ] || fail "doctor exited $rc with a FAIL, not 1"
as_kgpu kgpu-simctl reset
echo "== dcgm-exporter -a ... -c 100 (uid 65532; the image's link to kgpu, as a dcgm-exporter manifest runs it): /metrics"
[ "$(readlink /usr/bin/dcgm-exporter)" = kgpu ] || fail "/usr/bin/dcgm-exporter is not a link to kgpu"
as_kgpu dcgm-exporter -a 127.0.0.1:19401 -c 100 >/tmp/exporter.log 2>&1 &
exporter=$!
metrics=""
for _ in $(seq 100); do
  if { exec 3<>/dev/tcp/127.0.0.1/19401; } 2>/dev/null; then
    printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
    metrics=$(cat <&3)
    exec 3<&-
    grep -q '^DCGM_FI_DEV_GPU_TEMP{' <<<"$metrics" && break
  fi
  sleep 0.1
done
kill "$exporter"
wait "$exporter" || true
grep -q '^DCGM_FI_DEV_GPU_TEMP{' <<<"$metrics" || { cat /tmp/exporter.log; fail "kgpu exporter served no GPU temperatures"; }
echo "/metrics: $(grep -c '^DCGM_FI_DEV_GPU_TEMP{' <<<"$metrics") GPU temperatures"
echo "inside: PASS"
INSIDE
chmod +x "$rootfs/tmp/inside.sh"

step "in the image's root (chroot)"
t0=$SECONDS
unshare --mount --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount -t tmpfs tmpfs "$1/dev"
  for d in null zero random urandom tty; do touch "$1/dev/$d"; mount --bind "/dev/$d" "$1/dev/$d"; done
  mkdir -p "$1/dev/shm" && mount -t tmpfs tmpfs "$1/dev/shm"
  exec chroot "$1" env -i KGPU_EXPECT_VERSION="$2" /tmp/inside.sh
' _ "$rootfs" "$version"
echo "chroot part took $((SECONDS - t0)) s"

step "the image: $name:$version"
sed -n '/^image /,/^revision /p' "$work/b.log"
printf '\npackage.image: PASS\n'
