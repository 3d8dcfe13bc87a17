#!/usr/bin/env python3
"""cmake/kgpu-startup.order must not go stale unseen.

The release link places the functions the order file names at the front of .text
(cmake/static_deps.cmake); a name that no longer exists is skipped silently (the link passes
--no-warn-symbol-ordering), so a renamed or removed function just loses its place and the plugin's
resident memory creeps up. This check reads the kgpu executable's symbols (nm) and fails when more
than MAX_STALE of kgpu's own names in the file (mangled in namespace kgpu) are gone: then run
scripts/gen-startup-order.sh. Names of libraries (absl, gRPC, protobuf) are not checked: they change
only with Debian's packages.

Usage: check_startup_order.py ORDER_FILE KGPU_EXECUTABLE
"""
import re
import subprocess
import sys

MAX_STALE = 0.10


def base(name):
    # GCC's clones (foo.constprop.0, foo.isra.0, foo.part.0, foo.cold) keep the function's place.
    return re.sub(r'\.(constprop|isra|part|cold|lto_priv)(\.\d+)*.*$', '', name)


def main():
    order, exe = sys.argv[1], sys.argv[2]
    ours = [n.strip() for n in open(order) if '4kgpu' in n]
    if not ours:
        print(f'{order}: no kgpu function named; regenerate it with scripts/gen-startup-order.sh')
        return 1
    nm = subprocess.run(['nm', '--defined-only', exe], capture_output=True, text=True, check=True).stdout
    defined = {base(line.split()[-1]) for line in nm.splitlines() if line.strip()}
    stale = sorted(n for n in ours if base(n) not in defined)
    share = len(stale) / len(ours)
    print(f'{order}: {len(stale)} of {len(ours)} kgpu names are gone ({share:.0%}; the limit is {MAX_STALE:.0%})')
    for n in stale[:20]:
        print(f'  stale: {n}')
    if share > MAX_STALE:
        print('regenerate it: scripts/gen-startup-order.sh (needs valgrind and the release preset)')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
