#!/usr/bin/env bash
# The kgpu OCI image without a container engine (`make image`): Debian 12 (debootstrap
# --variant=minbase bookworm, what debian:12-slim is made from) with the kgpu package installed
# by apt, made into an image with umoci and written with skopeo as
#
#   OUT_DIR/kgpu-VERSION.oci.tar      OCI archive      skopeo copy oci-archive:... docker://REGISTRY/kgpu:VERSION,
#                                                      podman load -i, ctr -n k8s.io images import
#   OUT_DIR/kgpu-VERSION.docker.tar   docker-archive   docker load -i, podman load -i, ctr images import
#   OUT_DIR/kgpu-VERSION.digest       the manifest digest (what a registry shows after the push)
#   OUT_DIR/kgpu-VERSION.packages     the image's Debian packages and versions, one a line
#
# both named localhost/kgpu:VERSION (KGPU_IMAGE_NAME overrides the name). One layer; the default
# user is the unprivileged kgpu (uid/gid 65532); ENTRYPOINT ["kgpu"], CMD ["--help"], so a
# manifest's `args:` are kgpu's arguments; labels org.opencontainers.image.{title,description,
# version,revision,created,source,url,vendor}.
#
#   make-image.sh REPO_ROOT VERSION OUT_DIR [CACHE_DIR]
#
# The package is REPO_ROOT/build/release/packages/kgpu_VERSION_amd64.deb (`make package`). Only the
# kgpu package: kgpu-sim (the simulated NVML) is for demos and tests, and on a GPU node the NVIDIA
# Container Toolkit puts the driver's libnvidia-ml.so.1 into the container.
# CACHE_DIR (default REPO_ROOT/build/cache) keeps the debootstrap root as a tarball, the same one
# tests/package/package_test.sh uses, and the downloaded .debs (apt-archives/). Needs root (chroot,
# mount), debootstrap, umoci, skopeo and a Debian mirror.
#
# Reproducible: the image's contents are the packages the mirror serves and the kgpu package;
# every time stamp is SOURCE_DATE_EPOCH (default: the commit time of REPO_ROOT's HEAD) and what
# differs from one install to the next (logs, caches, backups, the dates in /etc/shadow) is removed
# or fixed. So the same commit and the same mirror state give the same digest. A mirror moves (a
# point release, a security update): pin it with KGPU_DEBIAN_SNAPSHOT=YYYYMMDDTHHMMSSZ
# (snapshot.debian.org, base root debootstrapped from it too) for the same digest later on.
# Environment:
#   SOURCE_DATE_EPOCH            time stamps and the created label (default: HEAD's commit time)
#   KGPU_IMAGE_REVISION          the revision label (default: HEAD's hash, -dirty with changes)
#   KGPU_DEBIAN_MIRROR           default http://deb.debian.org/debian
#   KGPU_DEBIAN_SECURITY_MIRROR  default http://deb.debian.org/debian-security
#   KGPU_DEBIAN_SNAPSHOT         a snapshot.debian.org time stamp: both mirrors from it
#   KGPU_IMAGE_NAME              default localhost/kgpu
set -euo pipefail
[ $# -ge 3 ] && [ $# -le 4 ] || { echo "usage: make-image.sh REPO_ROOT VERSION OUT_DIR [CACHE_DIR]" >&2; exit 2; }
root=$(cd "$1" && pwd) version=$2 out=$3 cache=${4:-$1/build/cache}
name=${KGPU_IMAGE_NAME:-localhost/kgpu}
step() { printf '\n== %s\n' "$*"; }
fail() { echo "make-image: FAIL: $*" >&2; exit 1; }
# shellcheck source=scripts/bookworm-root.sh
. "$(dirname "${BASH_SOURCE[0]}")/bookworm-root.sh"
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot, mount): sudo make image"
for tool in debootstrap umoci skopeo unshare chroot tar gzip; do
  command -v "$tool" >/dev/null || fail "$tool not found: run scripts/install-deps.sh"
done
deb="$root/build/release/packages/kgpu_${version}_amd64.deb"
[ -s "$deb" ] || fail "no $deb: run make package"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "$deb is version $(dpkg-deb -f "$deb" Version), not $version"

mirror=${KGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${KGPU_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
tarball_name=bookworm-minbase.tar
apt_opts=()
if [ -n "${KGPU_DEBIAN_SNAPSHOT:-}" ]; then
  [[ $KGPU_DEBIAN_SNAPSHOT =~ ^[0-9]{8}T[0-9]{6}Z$ ]] || fail "KGPU_DEBIAN_SNAPSHOT is not YYYYMMDDTHHMMSSZ"
  mirror=http://snapshot.debian.org/archive/debian/$KGPU_DEBIAN_SNAPSHOT
  security=http://snapshot.debian.org/archive/debian-security/$KGPU_DEBIAN_SNAPSHOT
  tarball_name=bookworm-minbase-$KGPU_DEBIAN_SNAPSHOT.tar
  apt_opts=(-o Acquire::Check-Valid-Until=false)
fi

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null) ||
    fail "REPO_ROOT is not a git checkout: set SOURCE_DATE_EPOCH"
fi
export SOURCE_DATE_EPOCH
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
revision=${KGPU_IMAGE_REVISION:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
if [ -z "${KGPU_IMAGE_REVISION:-}" ] && [ "$revision" != unknown ] &&
  [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
t_start=$SECONDS

work=$(mktemp -d "${TMPDIR:-/tmp}/kgpu-image.XXXXXX")
cleanup() { rm -rf --one-file-system "$work"; }
trap cleanup EXIT
mkdir -p "$cache" "$cache/apt-archives/partial" "$out"

step "Debian 12 root (debootstrap --variant=minbase bookworm, $mirror)"
tarball="$cache/$tarball_name"
cached_bookworm_root "$tarball" "$work" "$mirror"
rootfs="$work/rootfs"
mkdir -p "$rootfs"
tar -C "$rootfs" --numeric-owner -xf "$tarball"

# Like debian:12-slim (debuerreotype-slimify): no documentation but the copyright files, no man
# pages, no translations, for what is installed now and what apt installs later.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/kgpu-slim" <<'EOF'
# kgpu image (scripts/make-image.sh): as debian:12-slim, no documentation but copyright files.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
cp "$deb" "$rootfs/tmp/kgpu.deb"

cat >"$rootfs/tmp/install.sh" <<'INSIDE'
#!/bin/bash
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
apt=(apt-get -qq -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false "$@")
echo "== apt-get update, dist-upgrade (the mirror's bookworm, bookworm-updates, bookworm-security)"
"${apt[@]}" update
"${apt[@]}" -y dist-upgrade >/tmp/apt.log 2>&1 || { tail -30 /tmp/apt.log; exit 1; }
echo "== apt-get install ./kgpu.deb"
"${apt[@]}" -y install /tmp/kgpu.deb >>/tmp/apt.log 2>&1 || { tail -30 /tmp/apt.log; exit 1; }
dpkg -s kgpu | grep -E '^(Package|Version|Depends):'
echo "== user kgpu (uid/gid 65532)"
groupadd --gid 65532 kgpu
useradd --uid 65532 --gid kgpu --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kgpu 2>/dev/null
# A manifest written for dcgm-exporter (command: [dcgm-exporter], its flags) runs kgpu's exporter
# unchanged: kgpu started under that name is `kgpu exporter` (src/cli/main.cc). In the image only,
# not in the package, whose /usr/bin must not clash with NVIDIA's dcgm-exporter package.
ln -s kgpu /usr/bin/dcgm-exporter
kgpu --version
dpkg-query -W -f '${Package} ${Version}\n' | LC_ALL=C sort >/tmp/packages.txt
INSIDE
chmod +x "$rootfs/tmp/install.sh"

step "apt installs the kgpu package in the root (chroot)"
t0=$SECONDS
unshare --mount --propagation private bash -c '
  set -e
  r=$1 archives=$2
  shift 2
  mount -t proc proc "$r/proc"
  mount --bind "$archives" "$r/var/cache/apt/archives"
  exec chroot "$r" env -i /tmp/install.sh "$@"
' _ "$rootfs" "$cache/apt-archives" "${apt_opts[@]}"
echo "took $((SECONDS - t0)) s"
cp "$rootfs/tmp/packages.txt" "$work/packages.txt"

step "what differs between two installs removed, time stamps fixed ($created)"
# debuerreotype-slimify's work for the files installed before the dpkg excludes existed.
find "$rootfs/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
for d in man groff info lintian linda; do rm -rf "${rootfs:?}/usr/share/$d"/*; done
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
# Package lists, downloaded packages, apt's binary caches, logs, backups of the databases
# (*-old, passwd- ...), ldconfig's aux cache, the build's temporary files and DNS.
rm -rf "${rootfs:?}"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/ldconfig/aux-cache \
  "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old "$rootfs"/etc/*- "$rootfs"/tmp/* "$rootfs"/var/tmp/*
mkdir -p "$rootfs/var/lib/apt/lists/partial"
find "$rootfs/var/cache/apt/archives" -type f -delete  # debootstrap's .debs (apt used CACHE_DIR's)
find "$rootfs/var/log" -type f -delete
# The mount points that the container runtime fills; /run keeps its directories (/var/lock is
# /run/lock), as in debian:12-slim.
find "$rootfs/dev" "$rootfs/proc" "$rootfs/sys" -mindepth 1 -delete
find "$rootfs/run" -mindepth 1 -not -type d -delete
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
# The image's sources: Debian's own mirrors, whatever mirror built it (as in debian:12-slim).
rm -f "$rootfs/etc/apt/sources.list"
cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# The day of the last password change (every account is locked or has none): the epoch's day.
sed -ri "s/^([^:]*:[^:]*:)[0-9]*(:.*)$/\1$((SOURCE_DATE_EPOCH / 86400))\2/" "$rootfs/etc/shadow"
du_bytes=$(du -sb "$rootfs" | cut -f1)

step "the layer (tar sorted by name, owners numeric, every mtime $SOURCE_DATE_EPOCH)"
layer="$work/layer.tar"
mapfile -t top < <(cd "$rootfs" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort)
tar -C "$rootfs" --sort=name --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" --format=pax \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$layer" -- "${top[@]}" ||
  fail "tar of the root failed"
tar_bytes=$(stat -c %s "$layer")

step "OCI image (umoci)"
oci="$work/oci"
ref="$oci:$version"
umoci init --layout "$oci"
umoci new --image "$ref"
umoci raw add-layer --image "$ref" --history.created "$created" \
  --history.created_by "scripts/make-image.sh: debootstrap --variant=minbase bookworm; apt-get install kgpu_${version}_amd64.deb" \
  "$layer"
labels=(
  "org.opencontainers.image.title=kgpu"
  "org.opencontainers.image.description=kgpu: GPU device plugin, exporter, node labels, extender and webhook for Kubernetes"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.created=$created"
  "org.opencontainers.image.source=https://github.com/kgpu/kgpu"
  "org.opencontainers.image.url=https://github.com/kgpu/kgpu"
  "org.opencontainers.image.vendor=kgpu"
)
label_args=()
for l in "${labels[@]}"; do label_args+=(--config.label "$l"); done
umoci config --image "$ref" --no-history --created "$created" --author "kgpu" \
  --architecture amd64 --os linux \
  --config.user 65532:65532 --config.entrypoint kgpu --config.cmd=--help --config.workingdir / \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "${label_args[@]}"
umoci gc --layout "$oci"

step "archives in $out"
oci_tar="$out/kgpu-$version.oci.tar" docker_tar="$out/kgpu-$version.docker.tar"
rm -f "$oci_tar" "$docker_tar"
# The OCI archive is the layout tarred here, so that the file too is the same from one run to the
# next (skopeo's oci-archive: has the time of the copy in it). index.json names the image twice:
# org.opencontainers.image.ref.name (skopeo, podman) and io.containerd.image.name (ctr, docker).
skopeo copy -q "oci:$ref" "oci:$work/export:$name:$version"
python3 - "$work/export/index.json" "$name:$version" <<'PY'
import json, sys
path, ref = sys.argv[1:]
index = json.load(open(path))
(m,) = index["manifests"]
m.setdefault("annotations", {})["io.containerd.image.name"] = ref
json.dump(index, open(path, "w"), separators=(",", ":"), sort_keys=True)
PY
tar -C "$work/export" --sort=name --owner=0 --group=0 --numeric-owner --mode=a+rX,u+w,go-w \
  --mtime="@$SOURCE_DATE_EPOCH" --format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$oci_tar" blobs index.json oci-layout
skopeo copy -q "oci:$ref" "docker-archive:$docker_tar:$name:$version"
digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$oci_tar")
echo "$digest" >"$out/kgpu-$version.digest"
cp "$work/packages.txt" "$out/kgpu-$version.packages"
config_digest=$(skopeo inspect --raw "oci-archive:$oci_tar" | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"]["digest"])')
layer_bytes=$(skopeo inspect --raw "oci-archive:$oci_tar" | python3 -c 'import json,sys; print(sum(l["size"] for l in json.load(sys.stdin)["layers"]))')
# Run through sudo (make image): the archives belong to the user who ran it.
if [ -n "${SUDO_UID:-}" ] && [ -n "${SUDO_GID:-}" ]; then
  chown "$SUDO_UID:$SUDO_GID" "$out" "$oci_tar" "$docker_tar" "$out/kgpu-$version.digest" "$out/kgpu-$version.packages"
fi
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
cat <<EOF
image     $name:$version ($(wc -l <"$work/packages.txt") Debian packages, $(mb "$du_bytes") unpacked, layer tar $(mb "$tar_bytes"))
digest    $digest (manifest; the registry's digest after a push of the OCI archive)
image ID  $config_digest (config; what docker images / crictl images show)
size      $(mb "$layer_bytes") compressed (the layer as pulled), archives: $(mb "$(stat -c %s "$oci_tar")") OCI, $(mb "$(stat -c %s "$docker_tar")") docker
revision  $revision, created $created (SOURCE_DATE_EPOCH)
files     $oci_tar
          $docker_tar
took      $((SECONDS - t_start)) s
EOF
