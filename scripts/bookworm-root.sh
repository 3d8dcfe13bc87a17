# Sourced by scripts/make-image.sh and tests/package/package_test.sh: the Debian 12 root both
# start from (debootstrap --variant=minbase bookworm), made once and kept as a tarball in their
# cache directory, since debootstrap takes minutes. The caller defines fail().
#
#   cached_bookworm_root TARBALL WORK_DIR [MIRROR]
#
# Makes TARBALL unless it exists (debootstrap in WORK_DIR/bootstrap, removed afterwards); MIRROR
# defaults to debootstrap's own (deb.debian.org).
cached_bookworm_root() {
  local tarball=$1 work=$2 mirror=${3:-}
  if [ -s "$tarball" ]; then
    echo "from the cache: $tarball"
    return
  fi
  local t0=$SECONDS
  debootstrap --variant=minbase bookworm "$work/bootstrap" ${mirror:+"$mirror"} >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log"; fail "debootstrap failed (log above)"; }
  tar -C "$work/bootstrap" -cf "$tarball.tmp.$$" . && mv "$tarball.tmp.$$" "$tarball"
  rm -rf --one-file-system "$work/bootstrap"
  echo "debootstrap took $((SECONDS - t0)) s; cached as $tarball"
}
