#!/usr/bin/env bash
# kgpu's command line as a whole (README "Exit codes"), on a simulated node:
# - the global options (--nvml-library, --log-level, --sysfs-root) are read before or after the
#   command, nested commands included (mig show, slurm gres, slurm-bridge status, quota plan, and
#   kgpu run as dcgm-exporter); no command declares an option of the same name (a new one fails
#   here, to be chosen on purpose); --dev-root means NVIDIA_DEV_ROOT (the root above dev/) in every
#   command that has it, and the global --dev-root of earlier releases (the /dev directory) still
#   works, with a deprecation warning;
# - a command that does not exist, at any level, is named with the nearest one, or with the list of
#   commands, and a group without its command lists them; all exit 2 (usage). Commands that take
#   positional arguments (slurm-bridge reclaim, hook) still take them.
#   cli_test.sh KGPU_BIN SIM_LIB
set -euo pipefail
kgpu=$1 sim_lib=$2
work=$(mktemp -d /tmp/kgpu-cli-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export KGPU_SIM_NODE=l4x4 KGPU_SIM_STATE="$work/sim.state"
unset KGPU_NVML_LIBRARY KGPU_LOG_LEVEL KGPU_SYSFS_ROOT KGPU_DEV_ROOT NVIDIA_DEV_ROOT KUBECONFIG

out=""
run() {  # run WANT_RC ARGS...: kgpu ARGS, its stdout and stderr in $out; fails unless it exits WANT_RC
  local want=$1 rc=0
  shift
  out=$("$kgpu" "$@" 2>&1) || rc=$?
  [ "$rc" = "$want" ] || fail "kgpu $*: exit $rc, want $want: $out"
}
has() {  # has TEXT: $out contains TEXT
  grep -qF -- "$1" <<<"$out" || fail "the output lacks '$1': $out"
}
hasnt() {  # hasnt TEXT: $out does not contain TEXT
  ! grep -qF -- "$1" <<<"$out" || fail "the output has '$1': $out"
}

# ---------------------------------------------------------------- global options after the command
run 0 --nvml-library "$sim_lib" --log-level debug devices
has "NVIDIA L4"
run 0 devices --nvml-library "$sim_lib" --log-level debug
has "NVIDIA L4"
run 0 devices --json --log-level=debug --nvml-library="$sim_lib"
has '"gpus"'
# The value after the command reaches the global option: an unknown level is refused as usage, and
# given on both sides it is one option given twice.
run 2 devices --log-level loud
has "kgpu: --log-level: unknown level 'loud'"
run 2 --log-level info devices --log-level debug
has "--log-level"
# Nested commands, two and three levels down (the last ones stop at the level, before any API call).
run 0 mig show --log-level debug --nvml-library "$sim_lib"
has "MIG: not supported"
run 0 slurm gres --nvml-library "$sim_lib" --log-level debug --output gres
has "Name=gpu Type=nvidia_l4 File=/dev/nvidia0"
run 2 slurm-bridge status --log-level loud
has "kgpu: --log-level: unknown level 'loud'"
run 2 quota plan --shares team-a=50 --log-level loud
has "kgpu: --log-level: unknown level 'loud'"
# Through the dcgm-exporter link (GoStyleFlags makes it `kgpu exporter ...` first).
ln -s "$kgpu" "$work/dcgm-exporter"
rc=0
out=$("$work/dcgm-exporter" --log-level loud 2>&1) || rc=$?
[ "$rc" = 2 ] || fail "dcgm-exporter --log-level loud: exit $rc, want 2: $out"
has "kgpu: --log-level: unknown level 'loud'"

# --dev-root is the root above dev/ (NVIDIA_DEV_ROOT) wherever it is given: slurm gres's File=, from
# the flag, the env and the device plugin's config file (flags.nvidiaDevRoot), as the plugin reads it.
run 0 --nvml-library "$sim_lib" slurm gres --dev-root /b --output gres
has "File=/b/dev/nvidia0"
NVIDIA_DEV_ROOT=/c run 0 --nvml-library "$sim_lib" slurm gres --output gres
has "File=/c/dev/nvidia0"
printf 'version: v1\nflags:\n  nvidiaDevRoot: /d\n' >"$work/devroot.yaml"
run 0 --nvml-library "$sim_lib" slurm gres --config-file "$work/devroot.yaml" --output gres
has "File=/d/dev/nvidia0"
run 0 --nvml-library "$sim_lib" slurm gres --output gres
has "File=/dev/nvidia0"
# The global --dev-root of earlier releases (the /dev directory itself), before the command: it
# still works for one release, with a warning naming the replacement; the command's own wins.
run 0 --nvml-library "$sim_lib" --dev-root /a slurm gres --output gres
has "File=/a/nvidia0"
has "kgpu slurm gres: the global --dev-root (the /dev directory) is deprecated, use kgpu slurm gres --dev-root, the root above dev/"
KGPU_DEV_ROOT=/e run 0 --nvml-library "$sim_lib" slurm gres --output gres
has "File=/e/nvidia0"
has "kgpu slurm gres: KGPU_DEV_ROOT (the /dev directory) is deprecated, use NVIDIA_DEV_ROOT"
run 0 --nvml-library "$sim_lib" --dev-root /a slurm gres --dev-root /b --output gres
has "File=/b/dev/nvidia0"
run 1 --nvml-library "$sim_lib" doctor --dev-root "$work/nothing-here"
has "$work/nothing-here/dev/nvidiactl"
KGPU_DOCTOR_DEV_ROOT="$work/env-root" run 1 --nvml-library "$sim_lib" doctor
has "$work/env-root/dev/nvidiactl"
KGPU_DEV_ROOT="$work/old-dev" run 1 --nvml-library "$sim_lib" doctor
has "$work/old-dev/nvidiactl"
has "kgpu doctor: KGPU_DEV_ROOT (the /dev directory) is deprecated, use KGPU_DOCTOR_DEV_ROOT"
# A command that does not read device nodes says nothing of KGPU_DEV_ROOT (a pod's env keeps it);
# given the global --dev-root, it says that it does not read it, never pointing at a flag it lacks.
KGPU_DEV_ROOT=/x run 0 --nvml-library "$sim_lib" devices
hasnt "deprecated"
run 0 --nvml-library "$sim_lib" --dev-root /x devices
has "kgpu devices: the global --dev-root (the /dev directory) is deprecated and not read by this command, which reads no device nodes: drop it"
hasnt "use the command's --dev-root"
run 0 devices --help
hasnt "--dev-root"
# Every command's own options, against the global ones: there is no clash.
globals=" --nvml-library --log-level --sysfs-root --version "
clashes() {  # clashes PATH...: "PATH: --name" for each global option name the command declares
  local help sub name
  help=$("$kgpu" "$@" --help) || fail "kgpu $* --help failed"
  if [ $# -gt 0 ]; then
    for name in $(sed -n '/^Options:/,/^$/p' <<<"$help" | awk '/^  -/ {print $1}' | tr ',' ' '); do
      case "$globals" in *" $name "*) echo "$*: $name" ;; esac
    done
  fi
  for sub in $(sed -n '/^Subcommands:/,/^$/p' <<<"$help" | awk '/^  [a-z]/ {print $1}'); do clashes "$@" "$sub"; done
}
got=$(clashes)
want=""
[ "$got" = "$want" ] || fail "commands whose own option shadows a global one:
$got
want:
$want"
# The help says where global options may go.
run 0 devices --help
has "may come before or after the command"
echo "ok: global options before and after the command"

# ---------------------------------------------------------------- unknown commands
run 2 devces
has "kgpu: unknown command 'devces'; did you mean 'devices'?"
run 2 --log-level debug devces --json
has "kgpu: unknown command 'devces'; did you mean 'devices'?"
run 2 dev
has "kgpu: unknown command 'dev'; did you mean 'devices' or 'device-plugin'?"
run 2 frobnicate
has "kgpu: unknown command 'frobnicate'; commands: devices, doctor, health, version, device-plugin,"
has "(kgpu --help)"
run 2 mig aply
has "kgpu mig: unknown command 'aply'; did you mean 'apply'?"
run 2 mig list --log-level debug
has "kgpu mig: unknown command 'list'; commands: show, apply (kgpu mig --help)"
run 2 slurm bridge
has "kgpu slurm: unknown command 'bridge'; commands: gres (kgpu slurm --help)"
run 2 slurm-bridge hok suspend n1
has "kgpu slurm-bridge: unknown command 'hok'; did you mean 'hook'?"
run 2 quota plna --shares team-a=50
has "kgpu quota: unknown command 'plna'; did you mean 'plan'?"
# quota's command is optional: a stray word that is no near miss keeps CLI11's message.
run 2 quota team-a
has "team-a"
if grep -qF "unknown command" <<<"$out"; then fail "kgpu quota team-a: taken for a command: $out"; fi
# No command where one is required: the list.
run 2
has "kgpu: a command is required; commands: devices,"
run 2 --log-level debug
has "kgpu: a command is required; commands: devices,"
run 2 mig
has "kgpu mig: a command is required; commands: show, apply (kgpu mig --help)"
# What a terminal would act on is escaped, not echoed.
run 2 $'dev\033[31m'
has "kgpu: unknown command 'dev\\x1B[31m'"
if grep -q $'\033' <<<"$out"; then fail "an escape byte reached the output: $out"; fi
# Help still wins, and a command's positional arguments are still its own: slurm-bridge reclaim
# and hook get past parsing to the kubeconfig (exit 1, not 2).
run 0 devces --help
has "Subcommands:"
run 1 slurm-bridge reclaim n1 --kubeconfig "$work/missing"
run 1 slurm-bridge hook suspend n1 --kubeconfig "$work/missing"
run 2 slurm-bridge hook suspnd n1 --kubeconfig "$work/missing"
has "suspnd"
echo "ok: unknown commands"

# ---------------------------------------------------------------- the same input, the same exit code
# README "Exit codes": usage is 2 in every command, bad input (a file that is missing or wrong, no
# kubeconfig, a port in use) is 1 in every command.
for cmd in devices doctor health version device-plugin exporter node node-labels node-template extender webhook \
           "mig show" "mig apply" sim "slurm gres" quota "quota plan --shares a=50" "slurm-bridge status" \
           "slurm-bridge run"; do
  # shellcheck disable=SC2086
  run 2 $cmd --no-such-flag
  has "--no-such-flag"
done
run 2 exporter --nvml-library "$sim_lib" -a :70000
run 2 extender --address 127.0.0.1:70000 --kubeconfig "$work/missing"
run 2 webhook --address 127.0.0.1:70000 --insecure-http
(
  unset NODE_NAME
  run 2 node-labels --nvml-library "$sim_lib" --oneshot
  has "--node-name"
)
# No kubeconfig where one is needed.
for cmd in extender quota "quota plan --shares a=50" "slurm-bridge status" "slurm-bridge run --once"; do
  # shellcheck disable=SC2086
  run 1 $cmd --kubeconfig "$work/missing"
  has "$work/missing"
done
run 1 node-labels --nvml-library "$sim_lib" --node-name n1 --oneshot --kubeconfig "$work/missing"
has "$work/missing"
# Certificate files that are missing: bad input, not usage.
run 1 webhook --address 127.0.0.1:0 --tls-cert-file "$work/missing.crt" --tls-key-file "$work/missing.key"
has "cannot load the certificate and key"
run 1 extender --address 127.0.0.1:0 --tls-cert-file "$work/missing.crt" --tls-key-file "$work/missing.key" \
  --kubeconfig "$work/missing"
# A config or counters file that is missing.
run 1 device-plugin --nvml-library "$sim_lib" --config-file "$work/missing.yaml"
has "$work/missing.yaml"
run 1 exporter --nvml-library "$sim_lib" -f "$work/missing.csv"
has "$work/missing.csv"
# A listen port in use.
python3 -c 'import socket,sys,time
s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' >"$work/port" &
holder=$!
for _ in $(seq 1 100); do [ -s "$work/port" ] && break; sleep 0.05; done
port=$(cat "$work/port")
run 1 exporter --nvml-library "$sim_lib" -a "127.0.0.1:$port"
has "$port"
run 1 webhook --address "127.0.0.1:$port" --insecure-http
has "$port"
kill "$holder"; wait "$holder" 2>/dev/null || true
echo "ok: exit codes"

# ---------------------------------------------------------------- one name, one meaning
# NVIDIA's IMEX flags mean what the config file's imex section means; --cdi-feature-flags is
# refused with the reason (kgpu writes its own CDI specs).
run 2 device-plugin --nvml-library "$sim_lib" --cdi-feature-flags disable-nvsandboxutils
has "kgpu writes its CDI specs itself"
run 2 device-plugin --nvml-library "$sim_lib" --imex-channel-ids 1
has "only channel 0"
run 1 device-plugin --nvml-library "$sim_lib" --imex-channel-ids 0 --imex-required --dev-root "$work/no-dev"
has "IMEX channel 0 is required"
# kgpu health: Go durations, the plugin's default recovery (5m) or never; the old spellings warn.
run 0 health --help
has "--recover-after DURATION|never=5m0s"
run 2 health --nvml-library "$sim_lib" --recover-after 5x
has "--recover-after"
run 0 health --nvml-library "$sim_lib" --duration 1s --probe-interval-ms 200 --recover-after never
has "kgpu health: --probe-interval-ms is deprecated, use --probe-interval"
# kgpu node: one PodResources socket, under the plugin's or dcgm-exporter's name, not two paths.
run 2 node --nvml-library "$sim_lib" --pod-resources-socket "$work/a.sock" --pod-resources-kubelet-socket "$work/b.sock"
has "name one socket"
# The Slurm bridge's API rate limit has kube-scheduler's name.
run 1 slurm-bridge run --once --kube-qps 20 --kubeconfig "$work/missing"
has "--kube-qps is deprecated, use --kube-api-qps"
echo "ok: one name per setting"

# ---------------------------------------------------------------- long work shows progress
# kgpu sim on a terminal (script(1) gives it one) draws "k/N runs" on stderr and clears it; not on
# a terminal, or with --quiet, nothing but the table.
printf 'sn,cpu_milli,memory_mib,gpu,model\n' >"$work/nodes.csv"
for i in 0 1 2 3; do printf 'n%d,64000,262144,8,A100\n' "$i" >>"$work/nodes.csv"; done
printf 'name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n' \
  >"$work/pods.csv"
for i in $(seq 0 99); do printf 'p%d,1000,1024,1,500,,LS,Running,%d,%d,%d\n' "$i" "$i" $((i + 1000)) "$i" >>"$work/pods.csv"; done
sim=(sim --nodes "$work/nodes.csv" --pods "$work/pods.csv" --policy bestfit,fgd --seeds 1-3 --jobs 1)
if command -v script >/dev/null; then
  tty_out=$(script -qec "$(printf '%q ' "$kgpu" "${sim[@]}")" /dev/null 2>&1)
  grep -q "kgpu sim: [0-9]/6 runs, [0-9]* s elapsed" <<<"$tty_out" || fail "no progress on a terminal: $tty_out"
  tty_out=$(script -qec "$(printf '%q ' "$kgpu" "${sim[@]}" --quiet)" /dev/null 2>&1)
  if grep -q "/6 runs" <<<"$tty_out"; then fail "progress despite --quiet: $tty_out"; fi
else
  echo "SKIP: sim progress on a terminal (no script(1))"
fi
run 0 "${sim[@]}"
if grep -q "/6 runs" <<<"$out"; then fail "progress on a pipe: $out"; fi
has "bestfit"
# kgpu mig apply on a terminal: "k/N GPUs" while it changes them, each GPU's line printed whole
# (never mixed into the progress line); with --quiet or on a pipe, only the lines.
printf 'version: v1\nflags:\n  migStrategy: mixed\nmig:\n  layouts:\n    halves:\n      - devices: [0]\n        mig-devices: {"3g.20gb": 2}\n    sevenths:\n      - devices: [0]\n        mig-devices: {"1g.5gb": 7}\n' \
  >"$work/mig.yaml"
mkdir -p "$work/kubelet"
mig=(--nvml-library "$sim_lib" mig apply --config-file "$work/mig.yaml" --no-kubelet-check --kubelet-dir "$work/kubelet"
  --lock-file "$work/mig.lock")
export KGPU_SIM_NODE=dgx-a100-mig KGPU_SIM_STATE="$work/mig-sim.state"
if command -v script >/dev/null; then
  tty_out=$(script -qec "$(printf '%q ' "$kgpu" "${mig[@]}" --layout halves)" /dev/null 2>&1)
  grep -q "kgpu mig apply: [01]/1 GPUs, [0-9]* s elapsed" <<<"$tty_out" || fail "mig apply: no progress: $tty_out"
  grep -q "^GPU 0: .*3g.20gb" <<<"$(tr '\r' '\n' <<<"$tty_out")" || fail "mig apply: the GPU's line is mixed: $tty_out"
  tty_out=$(script -qec "$(printf '%q ' "$kgpu" "${mig[@]}" --layout sevenths --quiet)" /dev/null 2>&1)
  if grep -q "/1 GPUs" <<<"$tty_out"; then fail "mig apply: progress despite --quiet: $tty_out"; fi
  grep -q "applied layout 'sevenths'" <<<"$tty_out" || fail "mig apply --quiet: $tty_out"
else
  echo "SKIP: mig apply progress on a terminal (no script(1))"
fi
run 0 "${mig[@]}" --layout halves
if grep -q "/1 GPUs" <<<"$out"; then fail "mig apply: progress on a pipe: $out"; fi
has "applied layout 'halves'"
export KGPU_SIM_NODE=l4x4 KGPU_SIM_STATE="$work/sim.state"
echo "ok: progress"
echo PASS
