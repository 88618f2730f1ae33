"""Memory each lab host uses: the proportional set size of its systemd-nspawn and below."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from lab.host import HostPaths, nspawn_pid


def host_memory(hosts: dict[str, HostPaths]) -> dict[str, int]:
    """{host: bytes} for running hosts; PSS shares the common root's pages fairly between hosts."""
    children = _children()
    memory = {}
    for name, paths in hosts.items():
        pid = nspawn_pid(paths)
        if pid is None:
            continue
        memory[name] = sum(_pss_bytes(member) for member in _tree(pid, children))
    return memory


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children[parent].append(int(entry.name))
    return children


def _tree(pid: int, children: dict[int, list[int]]) -> list[int]:
    members, pending = [], [pid]
    while pending:
        current = pending.pop()
        members.append(current)
        pending.extend(children.get(current, []))
    return members


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
