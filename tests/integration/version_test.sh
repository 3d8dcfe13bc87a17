#!/usr/bin/env bash
# `kgpu --version` and `kgpu version` print "kgpu <project VERSION> (commit <git commit>)", the
# commit being the one the binary was built from (HEAD at build time, "-dirty" with uncommitted
# changes): in a git checkout it must be one of its commits.
#   version_test.sh KGPU_BIN VERSION SOURCE_DIR
set -euo pipefail
kgpu=$1 version=$2 src=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$kgpu" --version) || fail "kgpu --version exited $?"
sub=$("$kgpu" version) || fail "kgpu version exited $?"
[ "$out" = "$sub" ] || fail "kgpu --version says '$out' but kgpu version says '$sub'"
[[ "$out" =~ ^kgpu\ ([0-9]+\.[0-9]+\.[0-9]+)\ \(commit\ ([0-9a-f]{12}(-dirty)?|unknown)\)$ ]] ||
  fail "kgpu --version: '$out' is not 'kgpu X.Y.Z (commit <12 hex digits>[-dirty])'"
[ "${BASH_REMATCH[1]}" = "$version" ] || fail "kgpu --version says ${BASH_REMATCH[1]}, project(VERSION) is $version"
commit=${BASH_REMATCH[2]}
# In a git checkout the commit must be one of its commits (the binary may predate the last commit).
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  [ "$commit" != unknown ] || fail "kgpu --version says commit unknown, but $src is a git checkout"
  git -C "$src" cat-file -e "${commit%-dirty}^{commit}" 2>/dev/null ||
    fail "kgpu --version names commit $commit, which is not a commit of $src"
fi
echo "ok: $out"
