"""The one way gpuinfra runs a shell command on a cluster host outside pyinfra: OpenSSH with the
cluster's settings (`toolkit.ssh`: `-F /dev/null`, host keys always checked against the
inventory's known_hosts, batch mode, the bastion hop), a deadline, and one result shape.

Day-2 flows, the etcd role's pre-apply check, the GPU fleet check and rolling reboots all call
`run_remote`; each takes it as a parameter where its tests stand in for the hosts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from toolkit.ssh import ssh_argv

if TYPE_CHECKING:
    from inventory.model import LoadedCluster

SSH_FAILED = 255  # ssh's own exit status: it could not connect, authenticate or verify the key
TIMED_OUT = 124  # as coreutils' timeout(1) reports it
NOT_FOUND = 127  # as a shell reports a missing program: no ssh on this machine


@dataclass(frozen=True)
class RemoteResult:
    """What one command on one host came to. `exit_code` is the remote command's status, or
    SSH_FAILED, TIMED_OUT (`timed_out` set) or NOT_FOUND when it never ran to its end."""

    host: str
    exit_code: int
    stdout: str
    stderr: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, limit: int = 300) -> str:
        """The end of what the command said (stderr, else stdout), for an error message."""
        return (self.stderr.strip() or self.stdout.strip() or "failed")[-limit:]

    def last_line(self) -> str:
        """stderr's last line, else the exit status: why ssh or the command gave up."""
        return (self.stderr.strip().splitlines() or [f"exit {self.exit_code}"])[-1]


# (cluster, inventory host, shell command, timeout=seconds) -> result; `run_remote` is the real
# one, a test passes a stand-in.
RemoteRunner = Callable[..., RemoteResult]


def run_remote(
    loaded: LoadedCluster,
    host: str,
    command: str,
    *,
    timeout: float,
    stdin: bytes | None = None,
    stdout: IO[bytes] | None = None,
) -> RemoteResult:
    """Run `command` by the remote user's shell on inventory host `host`; wait at most
    `timeout` seconds. `stdin` is sent to the command (nothing otherwise: the operator's
    terminal is never read); with `stdout` given, the output is written there (a snapshot
    streamed to a file) and the result's stdout is empty. Never raises for what happens on
    the other side: a refused host key, a timeout or a missing ssh is a result."""
    argv = [*ssh_argv(loaded, host), command]
    feed = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    try:
        done = subprocess.run(
            argv,
            **feed,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return RemoteResult(host, TIMED_OUT, "", f"timed out after {timeout:g}s", timed_out=True)
    except FileNotFoundError:
        return RemoteResult(host, NOT_FOUND, "", f"{argv[0]}: not found")
    return RemoteResult(
        host,
        done.returncode,
        "" if stdout is not None else done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )
