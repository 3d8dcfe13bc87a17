#!/usr/bin/env bash
# The simulated driver's procfs, briefly: `kgpu-simctl procfs` writes /proc/driver/nvidia{,-caps}
# for a MIG node (what `kgpu device-plugin --proc-root` reads for the MIG device nodes).
#   scripts/demo-node-small.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-node-small.sh <build dir>}
bin=$build/bin
export LD_LIBRARY_PATH=$build/simnvml/lib
work=$(mktemp -d /tmp/kgpu-demo-ns-XXXXXX)
trap 'rm -rf "$work"' EXIT
export KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=demo-node KGPU_SIM_NODE=dgx-a100-mig
"$bin/kgpu-simctl" reset
echo "\$ kgpu-simctl procfs proc    # then: kgpu device-plugin --proc-root proc"
"$bin/kgpu-simctl" procfs "$work/proc"
echo "\$ grep 'gpu0/gi3/' proc/driver/nvidia-caps/mig-minors | head -2"
grep 'gpu0/gi3/' "$work/proc/driver/nvidia-caps/mig-minors" | head -2
echo "\$ cat proc/driver/nvidia/capabilities/gpu0/mig/gi3/access"
cat "$work/proc/driver/nvidia/capabilities/gpu0/mig/gi3/access"
