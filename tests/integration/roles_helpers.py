"""Shared steps of the role integration tests: run the CLI, apply roles, read pending changes."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.helpers import GPUINFRA, gpuinfra

__all__ = ["GPUINFRA", "gpuinfra"]  # where the role tests have long imported them from


def failed_run(result: subprocess.CompletedProcess[str]) -> str:
    """Why a JSON-reporting command failed, for an assertion message: each host that did not
    end ok or changed, with its error and its failing operations' errors (the report's tail
    alone is another host's notes), then the tail of stderr."""
    try:
        hosts = json.loads(result.stdout)["hosts"]
    except (ValueError, KeyError, TypeError):
        return result.stdout[-4000:] + result.stderr[-3000:]
    lines = [f"exit {result.returncode}"]
    for name, host in hosts.items():
        if host["status"] not in ("ok", "changed"):
            lines.append(f"{name}: {host['status']}: {host.get('error')}")
            lines += [f"  {op['name']}: {op['error']}" for op in host["operations"] if op["error"]]
    return "\n".join(lines) + "\n" + result.stderr[-3000:]


def apply_roles(inventory: Path, roles: str, *extra: str) -> dict:
    arguments = ["apply", str(inventory), "--roles", roles, "--yes", "--format", "json", *extra]
    result = gpuinfra(*arguments)
    assert result.returncode == 0, failed_run(result)
    return json.loads(result.stdout)


def pending(report: dict) -> dict[str, list[str]]:
    """Host -> names of the operations a plan or drift report says would change something."""
    return {
        name: [op["name"] for op in host["operations"] if op["changed"]]
        for name, host in report["hosts"].items()
        if any(op["changed"] for op in host["operations"])
    }


def probe_tcp(lab, host: str, address: str, port: int, timeout: float = 3) -> str:
    """Connect from `host` and say what came back: "open" (a listener answered), "refused" (an
    RST: the packet reached the kernel, the firewall let it through, nothing listens) or
    "timeout" (no answer at all: the firewall dropped it)."""
    script = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(float(sys.argv[3]))\n"
        "try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print('open')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except (TimeoutError, socket.timeout): print('timeout')\n"
    )
    command = f'python3 -c "{script}" {address} {port} {timeout}'
    return lab.ssh(host, command).stdout.strip()


def eventually(
    check: Callable[[], object], what: str, seconds: float = 90, interval: float = 1
) -> object:
    """Poll until check() returns something truthy; daemons, VRRP and Kubernetes
    settle asynchronously."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {seconds:.0f} s")
        time.sleep(interval)
