#!/usr/bin/env bash
# docs/cli.md is the binary's own reference (`kgpu --cli-reference`): every command, every option
# --help shows, with its environment variable, default and meaning. Fails when they disagree, and
# says how to regenerate the page.
#   cli_reference_test.sh KGPU_BIN DOCS_CLI_MD
set -euo pipefail
kgpu=$1 page=$2
if ! diff -u "$page" <(env -i PATH=/usr/bin:/bin "$kgpu" --cli-reference) >/tmp/kgpu-cli-reference.$$.diff; then
  cat /tmp/kgpu-cli-reference.$$.diff
  rm -f /tmp/kgpu-cli-reference.$$.diff
  echo "FAIL: docs/cli.md and kgpu --cli-reference disagree: run scripts/cli-docs.sh build/asan/bin/kgpu"
  exit 1
fi
rm -f /tmp/kgpu-cli-reference.$$.diff
# Every command of `kgpu --help` has its section.
for cmd in $("$kgpu" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && NF {print $1}'); do
  grep -q "^## \`kgpu $cmd\`" "$page" || { echo "FAIL: docs/cli.md has no section for kgpu $cmd"; exit 1; }
done
echo PASS
