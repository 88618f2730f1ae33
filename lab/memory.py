"""Memory each lab host uses: the proportional set size of its systemd-nspawn and below."""

from __future__ import annotations

from lab import processes
from lab.host import HostPaths, nspawn_pid


def host_memory(hosts: dict[str, HostPaths]) -> dict[str, int]:
    """{host: bytes} for running hosts; PSS shares the common root's pages fairly between hosts."""
    children = processes.children_map()
    memory = {}
    for name, paths in hosts.items():
        pid = nspawn_pid(paths)
        if pid is None:
            continue
        memory[name] = sum(_pss_bytes(member) for member in processes.tree(pid, children))
    return memory


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
