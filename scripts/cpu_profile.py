"""Where a long run's CPU goes on this machine: every process sampled every few seconds, its CPU
seconds summed by lab, lab host and command (a lab host's processes are in its network
namespace, /run/netns/gpuinfra.LAB.HOST).

    python3 scripts/cpu_profile.py sample OUT.jsonl [--every 10]   # until stopped
    python3 scripts/cpu_profile.py report OUT.jsonl [--from T] [--to T]

A process's figure is its own CPU and that of the children it has reaped (/proc/PID/stat:
utime, stime, cutime, cstime); a process gone since the last sample gives back what it was
counted, so its final share lands once, on the parent that reaped it. Short programs (dpkg,
ssh, a compiler) therefore count under the long-lived process that started them: sshd inside
a lab host, the controller's python; a pod's processes under the host's systemd, which reaps
containerd's shims; a host taken down under its systemd-nspawn, counted as that host's. The
total of all groups matches /proc/stat's busy time to within the processes not reaped by a
live parent; the report prints both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lab.naming import NETNS_PREFIX  # noqa: E402  (stdlib only: any python3 runs this)

TICKS = os.sysconf("SC_CLK_TCK")
NETNS = Path("/run/netns")


def busy_seconds() -> float:
    """The machine's CPU seconds not idle nor waiting on I/O, since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS


def where(netns: str | None) -> str:
    """`LAB/HOST` for a process inside a lab host, from its network namespace's name
    (lab.naming's `gpuinfra.LAB.HOST` under /run/netns); `machine` for everything else."""
    if netns and netns.startswith(NETNS_PREFIX):
        lab, _, host = netns.removeprefix(NETNS_PREFIX).rpartition(".")
        if lab and host:
            return f"{lab}/{host}"
    return "machine"


def nspawn_host(cmdline: bytes) -> str | None:
    """The network namespace a lab host's systemd-nspawn gives its host, from its arguments."""
    for argument in cmdline.decode(errors="replace").split("\0"):
        if argument.startswith("--network-namespace-path="):
            return Path(argument.split("=", 1)[1]).name
    return None


def namespaces() -> dict[int, str]:
    """Network namespace inode -> its name under /run/netns (lab hosts name theirs)."""
    found = {}
    for path in NETNS.glob("*") if NETNS.is_dir() else ():
        try:
            found[path.stat().st_ino] = path.name
        except OSError:
            continue
    return found


def processes() -> dict[tuple[str, str], tuple[str, float]]:
    """(pid, start time) -> ("WHERE|COMMAND", CPU seconds of it and its reaped children)."""
    named = namespaces()
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            netns = named.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
            command = stat[stat.index("(") + 1 : stat.rindex(")")]
            if command == "systemd-nspawn":
                # It runs in the machine's namespace but reaps its host's init: a host taken
                # down hands its whole tree's CPU to it, which belongs to that host.
                netns = nspawn_host(Path(f"/proc/{pid}/cmdline").read_bytes()) or netns
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = sum(int(value) for value in fields[11:15]) / TICKS
        found[(pid, fields[19])] = (f"{where(netns)}|{command}", cpu)
    return found


def sample(out: Path, every: float) -> None:
    before, busy = processes(), busy_seconds()
    with out.open("a") as sink:
        while True:
            time.sleep(every)
            now, busy_now = processes(), busy_seconds()
            groups: dict[str, float] = defaultdict(float)
            for key, (group, cpu) in now.items():
                groups[group] += cpu - before.get(key, (group, 0.0))[1]
            for key, (group, cpu) in before.items():
                if key not in now:
                    groups[group] -= cpu
            line = {"t": round(time.time(), 1), "busy": round(busy_now - busy, 2)}
            line["groups"] = {group: round(cpu, 2) for group, cpu in groups.items() if cpu}
            sink.write(json.dumps(line) + "\n")
            sink.flush()
            before, busy = now, busy_now


def report(path: Path, start: float, end: float, top: int = 25) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if start <= row["t"] <= end]
    if len(rows) < 2:
        return [f"{path}: fewer than two samples in that window"]
    span = rows[-1]["t"] - rows[0]["t"]
    busy = sum(row["busy"] for row in rows[1:])
    labs: dict[str, float] = defaultdict(float)
    hosts: dict[str, float] = defaultdict(float)
    commands: dict[str, float] = defaultdict(float)
    for row in rows[1:]:
        for group, cpu in row["groups"].items():
            place, command = group.split("|", 1)
            labs[place.split("/")[0]] += cpu
            hosts[place] += cpu
            commands[f"{place.split('/')[0]} {command}"] += cpu
    lines = [
        f"{span:.0f} s, {busy:.0f} CPU-s busy ({busy / span:.2f} cores), "
        f"{sum(labs.values()):.0f} CPU-s in processes"
    ]
    for title, table in (("by lab", labs), ("by host", hosts), ("by command", commands)):
        lines.append(title + ":")
        for name, cpu in sorted(table.items(), key=lambda item: -item[1])[:top]:
            lines.append(f"  {cpu:8.0f}  {cpu / busy:6.1%}  {name}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("sample", "report"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--from", dest="start", type=float, default=0.0)
    parser.add_argument("--to", dest="end", type=float, default=float("inf"))
    args = parser.parse_args()
    if args.mode == "sample":
        sample(args.path, args.every)
        return 0
    print("\n".join(report(args.path, args.start, args.end)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
