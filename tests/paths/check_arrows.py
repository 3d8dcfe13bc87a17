#!/usr/bin/env python3
"""The arrows between kgpu's rooms (docs/architecture.md), checked on every #include in src/.

Each room (a folder of src/) may include only the rooms listed for it here; anything else is an
arrow that must not exist (a cycle in the making, or a layer reaching past its neighbour).
Generated protobuf headers (*.pb.h) are allowed only in the files listed in PROTO_USERS.

Usage: check_arrows.py REPO_ROOT
"""
import pathlib
import re
import sys

ALLOWED = {
    'common': set(),
    'api': {'common'},
    'nvml': {'common'},
    'gpu': {'common', 'nvml'},
    'kubelet': {'common'},
    'sched': {'common'},
    'k8s': {'common'},
    'deviceplugin': {'common', 'api', 'nvml', 'gpu', 'kubelet'},
    'exporter': {'common', 'api', 'nvml', 'gpu', 'kubelet'},
    'extender': {'common', 'api', 'sched', 'k8s'},
    'slurm': {'common', 'api', 'nvml', 'gpu', 'k8s'},
    'dra': {'common', 'api', 'nvml', 'gpu', 'kubelet', 'k8s', 'deviceplugin'},
    'cli': None,  # the commands wire every room together
}
# The only files that include generated gRPC/protobuf code: they adapt it to our types.
PROTO_USERS = {
    'src/deviceplugin/server.cc',
    'src/kubelet/podresources.cc',
    'src/kubelet/checkpoint.cc',
    'src/kubelet/registration.cc',
    'src/dra/plugin.cc',
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main():
    root = pathlib.Path(sys.argv[1])
    rooms = {p.name for p in (root / 'src').iterdir() if p.is_dir()}
    bad = []
    for path in sorted((root / 'src').rglob('*')):
        if path.suffix not in ('.h', '.cc', '.c'):
            continue
        rel = path.relative_to(root).as_posix()
        room = path.relative_to(root / 'src').parts[0]
        if room not in ALLOWED:
            bad.append(f'{rel}: room src/{room}/ is not in docs/architecture.md (add it to check_arrows.py too)')
            continue
        for n, line in enumerate(path.read_text(errors='replace').splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target.endswith('.pb.h'):
                if rel not in PROTO_USERS:
                    bad.append(f'{rel}:{n}: includes generated code {target} (only {sorted(PROTO_USERS)} may)')
                continue
            other = target.split('/')[0]
            if '/' not in target or other not in rooms or other == room or ALLOWED[room] is None:
                continue
            if other not in ALLOWED[room]:
                bad.append(f'{rel}:{n}: {room} -> {other} ({target}) is an arrow that must not exist')
    for b in bad:
        print(b)
    print(f'{len(bad)} forbidden arrow(s)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
