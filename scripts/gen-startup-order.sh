#!/usr/bin/env bash
# Writes cmake/kgpu-startup.order: the functions of the kgpu executable that `kgpu device-plugin`
# runs from exec until it has registered with kubelet and served its first device list (and one
# second of idling after that), one mangled name per line. The release preset's link (lld,
# cmake/static_deps.cmake) places them first in .text, so that the few MB of code a running plugin
# needs sit together instead of being spread over the whole executable (RSS: bench/
# device_plugin_bench.cc). Names that no longer exist are ignored by the linker, and a function
# missing from the file only lands outside the packed region: a stale file costs memory, never
# correctness. Re-run after large changes to the plugin's start-up path:
#
#   scripts/gen-startup-order.sh        (needs valgrind; builds the release preset first)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "gen-startup-order.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cmake --preset release >/dev/null
cmake --build --preset release --target kgpu kgpu-fake-kubelet kgpu_simnvml
bin=$PWD/build/release/bin
dir=$(mktemp -d /tmp/kgpu-order-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir "$dir/kubelet"
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$dir/state KGPU_SIM_NODE_NAME=order-node
export LD_LIBRARY_PATH=$PWD/build/release/simnvml/lib
"$bin/kgpu-fake-kubelet" serve --dir "$dir/kubelet" >"$dir/kubelet.log" 2>&1 &
for _ in $(seq 100); do [ -S "$dir/kubelet/kubelet.sock" ] && break; sleep 0.05; done
valgrind --tool=callgrind --demangle=no --callgrind-out-file="$dir/cg.out" \
  "$bin/kgpu" device-plugin --kubelet-dir "$dir/kubelet" >"$dir/plugin.log" 2>&1 &
plugin=$!
for _ in $(seq 600); do grep -q "ListAndWatch nvidia.com/gpu: 8 devices" "$dir/kubelet.log" && break; sleep 0.1; done
grep -q "ListAndWatch nvidia.com/gpu: 8 devices" "$dir/kubelet.log" || {
  echo "gen-startup-order.sh: the plugin never registered; its log:" >&2; cat "$dir/plugin.log" >&2; exit 1; }
sleep 1
callgrind_control --dump "$plugin" >/dev/null
for _ in $(seq 100); do [ -s "$dir/cg.out.1" ] && break; sleep 0.1; done
kill "$plugin"
wait "$plugin" || true
# cg.out.1 names each object (ob=/cob=) and function (fn=/cfn=) once with "(id) name" and later
# by "(id)" alone; keep the functions whose code lies in the kgpu executable.
python3 - "$dir/cg.out.1" "$bin/kgpu" >cmake/kgpu-startup.order <<'EOF'
import re, sys
path, exe = sys.argv[1], sys.argv[2]
objs, fns, cur, out = {}, {}, None, set()
for line in open(path):
    m = re.match(r'^(ob|cob|fn|cfn|cfi|fi|fe|fl)=\((\d+)\)(?: (.*))?$', line.rstrip('\n'))
    if not m:
        continue
    kind, ident, name = m.groups()
    if kind in ('ob', 'cob'):
        if name:
            objs[ident] = name
        if kind == 'ob':
            cur = objs.get(ident)
    elif kind in ('fn', 'cfn'):
        if name:
            fns[ident] = name
        if kind == 'fn' and cur == exe:
            out.add(fns[ident])
names = sorted(n for n in out if not n.startswith('0x') and not n.startswith('('))
sys.stdout.write(''.join(n + '\n' for n in names))
EOF
echo "cmake/kgpu-startup.order: $(wc -l <cmake/kgpu-startup.order) functions"
