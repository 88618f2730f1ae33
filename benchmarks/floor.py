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

With `--probes PROBES.json` in place of STATE.json (the `floor-probe` engine), each host is sent
gpuinfra's own probe instead: the script `gpuinfra drift` sends it (every command its roles'
deploys asked when the last apply found it converged, batched: engine/fingerprint/), on stdin
to `sh -s` as drift sends it, and the whole answer is compared with the answer the benchmark
checked against the host's record before the runs (engines.py). What gpuinfra drift costs
beyond this engine is gpuinfra's controller; what this engine costs beyond the floor is the
rest of the state gpuinfra checks on each host.

With `--connect` and only HOSTS.json (the `connect` engine), each host runs `true`: the
connection alone, its key exchange and login included, which every engine pays before it checks
anything. What an engine costs above it is the work of its check.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def ssh_argv(hosts: dict, name: str) -> list[str]:
    """OpenSSH to one host, its key checked against the lab's known_hosts; no ssh_config read,
    as gpuinfra's probes read none (a ControlMaster there would spare the floor alone its key
    exchange)."""
    ssh = hosts["ssh"]
    argv = [
        "ssh", "-F", os.devnull, "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={ssh['known_hosts']}", "-o", "ConnectTimeout=10",
        "-p", str(ssh["port"]), "-l", ssh["user"],
    ]  # fmt: skip
    if ssh.get("key"):
        argv += ["-i", ssh["key"], "-o", "IdentitiesOnly=yes"]
    return [*argv, hosts["addresses"][name]]


def ask(hosts: dict, remote: dict[str, tuple[str, bytes | None]]) -> dict[str, tuple]:
    """Every host at once: start one ssh per host with its command (and what goes on its
    stdin), then collect (exit code, stdout, stderr) of each."""
    running = {}
    for name, (command, stdin) in remote.items():
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        process = subprocess.Popen(
            [*ssh_argv(hosts, name), command],
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            **pipes,
        )
        if stdin is not None:  # a few KiB: the pipe takes it whole, the host reads it at once
            process.stdin.write(stdin)
            process.stdin.close()
            process.stdin = None  # written: communicate() only reads
        running[name] = process
    answers = {}
    for name, process in running.items():
        output, errors = process.communicate()
        answers[name] = (process.returncode, output, errors)
    return answers


def _error(errors: bytes) -> dict:
    return {"changes": None, "differences": [], "error": errors.decode(errors="replace")[-300:]}


def check(state: dict, hosts: dict) -> dict:
    """Every host at once: start one ssh per host, then collect and compare the answers."""
    local_hashes = {
        f["src"]: hashlib.sha256(Path(f["src"]).read_bytes()).hexdigest()
        for host_files in state["files"].values()
        for f in host_files
    }
    packages = {
        name: [p for group in state["packages"][name] for p in group] for name in hosts["addresses"]
    }
    remote = {
        name: (remote_command(state["files"][name], packages[name]), None)
        for name in hosts["addresses"]
    }
    report = {}
    for name, (code, output, errors) in ask(hosts, remote).items():
        if code != 0:
            report[name] = _error(errors)
            continue
        text = output.decode(errors="replace")
        differences = compare(state["files"][name], packages[name], text, local_hashes)
        report[name] = {"changes": len(differences), "differences": differences, "error": None}
    return {"hosts": report}


def answer_digest(output: bytes) -> str:
    """The answer's digest with the fields of pyinfra's file facts that move while the host is
    unchanged masked, as engine/fingerprint/ masks them (toolkit.driftprobe, standard library
    only)."""
    from toolkit.driftprobe import lines_digest

    return lines_digest(output.decode(errors="surrogateescape").split("\n"))


def check_probes(probes: dict, hosts: dict) -> dict:
    """gpuinfra's probe on every host at once; a host whose answer is not the checked one
    counts as one change."""
    remote = {name: ("sh -s", probe["script"].encode()) for name, probe in probes.items()}
    report = {}
    for name, (code, output, errors) in ask(hosts, remote).items():
        if code != 0:
            report[name] = _error(errors)
            continue
        same = answer_digest(output) == probes[name]["digest"]
        differences = [] if same else ["the probe's answer differs from the checked one"]
        report[name] = {"changes": len(differences), "differences": differences, "error": None}
    return {"hosts": report}


def check_connect(hosts: dict) -> dict:
    """Every host at once, each running `true`: a host counts as checked when it answered."""
    answers = ask(hosts, {name: ("true", None) for name in hosts["addresses"]})
    report = {}
    for name, (code, _, errors) in answers.items():
        answered = {"changes": 0, "differences": [], "error": None}
        report[name] = answered if code == 0 else _error(errors)
    return {"hosts": report}


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[0] == "--connect":
        result = check_connect(json.loads(Path(args[1]).read_text()))
    else:
        probes = args[0] == "--probes"
        state_path, hosts_path = args[1:3] if probes else args[:2]
        state, hosts = (json.loads(Path(p).read_text()) for p in (state_path, hosts_path))
        result = check_probes(state, hosts) if probes else check(state, hosts)
    print(json.dumps(result, indent=2))
    hosts = result["hosts"].values()
    if any(h["error"] for h in hosts):
        return 4
    return 3 if any(h["changes"] for h in hosts) else 0


if __name__ == "__main__":
    sys.exit(main())
