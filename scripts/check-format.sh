#!/usr/bin/env bash
# Every C and C++ file git tracks is formatted as .clang-format says (clang-format 14, Debian 12's).
# Fix with `make format`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format missing: run scripts/install-deps.sh" >&2; exit 1; }
bad=()
while IFS= read -r f; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cc' '*.h' '*.c')
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from .clang-format (fix: make format):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check-format: $(git ls-files '*.cc' '*.h' '*.c' | wc -l) files formatted"
