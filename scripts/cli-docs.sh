#!/usr/bin/env bash
# Writes docs/cli.md, the reference of every kgpu command's options, from the binary's command
# table (`kgpu --cli-reference`):
#   scripts/cli-docs.sh [KGPU_BIN]      (default: build/dev/bin/kgpu)
# The test cli.reference fails when docs/cli.md and the binary disagree: run this after changing
# a command or an option.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kgpu=${1:-$root/build/dev/bin/kgpu}
# The environment must not change what the reference shows (defaults are the binary's own).
env -i PATH=/usr/bin:/bin "$kgpu" --cli-reference >"$root/docs/cli.md.tmp"
mv "$root/docs/cli.md.tmp" "$root/docs/cli.md"
echo "wrote docs/cli.md ($(grep -c '^## ' "$root/docs/cli.md") commands)"
