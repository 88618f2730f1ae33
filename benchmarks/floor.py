"""The floor of an SSH-based check, as a benchmark engine: one OpenSSH connection per host, all
hosts at once, one command per host that reads every managed file's hash, mode and owner and
asks dpkg for every package; the answers are compared here with the declared state.

It checks exactly what the flat pyinfra deploy and the Ansible playbook check (engines.py):
every managed file's content, mode, owner and group (a file that is present has its parent
directory), and every package of the host's roles installed (at its version when pinned).
Standard library only, so that the interpreter's start is all it costs beyond SSH.

    python -m benchmarks.floor STATE.json HOSTS.json

prints {"hosts": {name: {"changes": N, "differences": [...], "error": ...}}} and exits 0 when
no host differs, 3 when one does, 4 when a host could not be reached (gpuinfra drift's codes).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

FIELD = "\t"


def remote_command(files: list[dict[str, str]], packages: list[str]) -> str:
    """One shell command for one host: stat and hash every file, ask dpkg for every package."""
    paths = " ".join(shlex.quote(f["path"]) for f in files)
    names = " ".join(shlex.quote(p.split("=", 1)[0]) for p in packages)
    parts = ["export LC_ALL=C"]
    if paths:
        parts += [
            f"stat -c 'stat{FIELD}%n{FIELD}%a{FIELD}%U{FIELD}%G' -- {paths} 2>/dev/null",
            f"sha256sum -- {paths} 2>/dev/null | sed 's/^/hash{FIELD}/'",
        ]
    if names:
        fmt = f"pkg{FIELD}${{Package}}{FIELD}${{db:Status-Abbrev}}{FIELD}${{Version}}\\n"
        parts.append(f"dpkg-query -W -f '{fmt}' -- {names} 2>/dev/null")
    return "; ".join(parts) + "; true"


def compare(
    files: list[dict[str, str]], packages: list[str], output: str, local_hashes: dict[str, str]
) -> list[str]:
    """What differs between the declared state and one host's answers, one line each."""
    stats: dict[str, tuple[str, str, str]] = {}
    hashes: dict[str, str] = {}
    installed: dict[str, tuple[str, str]] = {}
    for line in output.splitlines():
        kind, _, rest = line.partition(FIELD)
        if kind == "stat":
            path, mode, user, group = rest.split(FIELD)
            stats[path] = (mode, user, group)
        elif kind == "hash":
            digest, _, path = rest.partition("  ")
            hashes[path] = digest
        elif kind == "pkg":
            name, status, version = rest.split(FIELD)
            installed[name] = (status.strip(), version)
    differences = []
    for managed in files:
        path = managed["path"]
        if path not in stats:
            differences.append(f"{path}: missing")
            continue
        mode, user, group = stats[path]
        if int(mode, 8) != int(managed["mode"], 8):
            differences.append(f"{path}: mode {mode}, declared {managed['mode']}")
        if (user, group) != (managed["user"], managed["group"]):
            differences.append(f"{path}: owner {user}:{group}")
        if hashes.get(path) != local_hashes[managed["src"]]:
            differences.append(f"{path}: content differs")
    for package in packages:
        name, _, version = package.partition("=")
        status, found = installed.get(name, ("", ""))
        if status != "ii":
            differences.append(f"package {name}: not installed")
        elif version and found != version:
            differences.append(f"package {name}: version {found}, declared {version}")
    return differences


def check(state: dict, hosts: dict) -> dict:
    """Every host at once: start one ssh per host, then collect and compare the answers."""
    local_hashes = {
        f["src"]: hashlib.sha256(Path(f["src"]).read_bytes()).hexdigest()
        for host_files in state["files"].values()
        for f in host_files
    }
    ssh = hosts["ssh"]
    running = {}
    for name, address in hosts["addresses"].items():
        packages = [p for group in state["packages"][name] for p in group]
        argv = [
            "ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={ssh['known_hosts']}", "-o", "ConnectTimeout=10",
            "-p", str(ssh["port"]), "-l", ssh["user"],
        ]  # fmt: skip
        if ssh.get("key"):
            argv += ["-i", ssh["key"], "-o", "IdentitiesOnly=yes"]
        argv += [address, remote_command(state["files"][name], packages)]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, text=True, **pipes)
        running[name] = (process, packages)
    report = {}
    for name, (process, packages) in running.items():
        output, errors = process.communicate()
        if process.returncode != 0:
            report[name] = {"changes": None, "differences": [], "error": errors.strip()[-300:]}
            continue
        differences = compare(state["files"][name], packages, output, local_hashes)
        report[name] = {"changes": len(differences), "differences": differences, "error": None}
    return {"hosts": report}


def main(argv: list[str] | None = None) -> int:
    state_path, hosts_path = (argv if argv is not None else sys.argv[1:])[:2]
    state = json.loads(Path(state_path).read_text())
    result = check(state, json.loads(Path(hosts_path).read_text()))
    print(json.dumps(result, indent=2))
    hosts = result["hosts"].values()
    if any(h["error"] for h in hosts):
        return 4
    return 3 if any(h["changes"] for h in hosts) else 0


if __name__ == "__main__":
    sys.exit(main())
