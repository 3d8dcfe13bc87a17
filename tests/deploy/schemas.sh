#!/usr/bin/env bash
# The Kubernetes JSON schemas for tests: installs npm kubernetes-models (and
# @kubernetes-models/prometheus-operator) with `npm ci` from tests/deploy/package-lock.json into
# WORK_DIR/npm, again only when the lock file changes, under a lock so that two tests running at
# once install it once. Prints nothing on success; exits 77 (skipped) when npm cannot reach its
# registry for a first install, 1 on any other failure.
#
#   schemas.sh REPO_ROOT WORK_DIR     then: node WORK_DIR/npm/validate.mjs OBJECTS.json [LABEL]
set -euo pipefail
root=$(cd "$1" && pwd) work=$2
here="$root/tests/deploy"
fail() { echo "schemas: FAIL: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node not found: run scripts/install-deps.sh (Debian package nodejs)"
command -v npm >/dev/null || fail "npm not found: run scripts/install-deps.sh (Debian package npm)"
mkdir -p "$work"
exec 9>"$work/npm.lock"
flock 9
if ! cmp -s "$here/package-lock.json" "$work/npm/package-lock.json" || [ ! -d "$work/npm/node_modules" ]; then
  rm -rf "$work/npm"
  mkdir -p "$work/npm"
  # Without the registry there are no schemas: a skip that says so, not a failure.
  rc=0
  timeout 30 npm ping --loglevel=error >"$work/npm-ping.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    why="npm ping exited $rc"
    [ "$rc" -eq 124 ] && why="npm ping had no answer within 30 s"
    echo "SKIPPED: npm cannot reach its registry $(npm config get registry) ($why),"
    echo "so the Kubernetes schemas (npm kubernetes-models) cannot be installed."
    rm -rf "$work/npm"
    exit 77
  fi
  cp "$here/package.json" "$here/package-lock.json" "$work/npm/"
  if ! (cd "$work/npm" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2; then
    rm -rf "$work/npm"  # no half-installed tree that the next run would take as current
    fail "npm ci in $work/npm failed"
  fi
fi
cp "$here/validate.mjs" "$work/npm/validate.mjs"
