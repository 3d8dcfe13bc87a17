#!/usr/bin/env bash
# The kgpu executable loads libcurl (Kubernetes client) and libcpp-httplib (exporter) only when a
# job uses them (src/cli/lazy_lib.h): neither they nor what they pull in (OpenSSL, GnuTLS,
# Kerberos, ...) may be a dependency of the binary, and a job without HTTP must not map them.
# Whether the loaded libraries then work is what the exporter's and `kgpu node-labels`'
# integration tests check (exporter_prometheus_test.sh, node_api_test).
#   lazy_libs_test.sh KGPU_BIN SIM_LIB [ubsan]
# ubsan: a build with UBSan's vptr check, whose code refers to httplib::Server's typeinfo (data,
# which only load-time linking can provide), so libcpp-httplib and OpenSSL stay DT_NEEDED there;
# libcurl's chain must still be absent. The package test checks the release binary in full.
set -euo pipefail
kgpu=$1 sim_lib=$2 mode=${3:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
lazy='libcurl|libcpp-httplib|libssl|libcrypto|libgnutls|libkrb5|libldap|libp11-kit'
[ "$mode" = ubsan ] && lazy='libcurl|libgnutls|libkrb5|libldap|libp11-kit'

needed=$(readelf -d "$kgpu" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "DT_NEEDED of $kgpu: $(tr '\n' ' ' <<<"$needed")"
if grep -E "$lazy" <<<"$needed"; then
  fail "kgpu links the libraries above at start-up; give each new symbol of theirs a forwarder in src/cli/lazy_curl.cc or src/cli/lazy_httplib.cc"
fi
# Every httplib function kgpu calls has a forwarder: in the UBSan build libcpp-httplib stays
# DT_NEEDED, so a call without one would pass unseen here and only the release binary (the
# package test) would load the library at start-up.
unforwarded=$(nm -D --undefined-only "$kgpu" | awk '{print $NF}' | grep -E '^_ZNK?7httplib' || true)
if [ -n "$unforwarded" ]; then
  fail "kgpu calls httplib functions without a forwarder in src/cli/lazy_httplib.cc: $(tr '\n' ' ' <<<"$unforwarded")"
fi
all=$(ldd "$kgpu")
if grep -E "$lazy" <<<"$all"; then
  fail "kgpu loads the libraries above at start-up (through another dependency)"
fi

# `kgpu devices` on the simulated node runs to the end without mapping any of them.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
LD_DEBUG=files LD_DEBUG_OUTPUT="$work/ld" KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE="$work/sim.state" \
  "$kgpu" --nvml-library "$sim_lib" devices >"$work/devices.txt" 2>&1 || { cat "$work/devices.txt"; fail "kgpu devices failed"; }
grep -q 'H100' "$work/devices.txt" || fail "kgpu devices listed no GPU: $(cat "$work/devices.txt")"
loaded=$(grep -ho 'file=[^ ]*' "$work"/ld.* | sort -u)
if grep -E "$lazy" <<<"$loaded"; then fail "kgpu devices loaded the libraries above"; fi
echo "ok: no HTTP libraries at start-up or in kgpu devices ($(wc -l <<<"$loaded") objects loaded)"
