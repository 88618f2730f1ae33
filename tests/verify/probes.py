"""Probes that run ON the host under test: what that host can reach, seen from where it sits."""

from __future__ import annotations

import shlex
from typing import Literal

TcpState = Literal["open", "refused", "filtered"]


def tcp_state(host, address: str, port: int, timeout: float = 3) -> TcpState:
    """Connect from the target host with bash's /dev/tcp. "refused" means a reset came back (a
    firewall let the packet through and nothing listens); "filtered" means no answer at all
    before the timeout (dropped on the way)."""
    script = f"exec 3<>/dev/tcp/{address}/{port}"
    result = host.run(f"timeout {timeout:g} bash -c {shlex.quote(script)}")
    if result.rc == 0:
        return "open"
    if result.rc == 124:
        return "filtered"
    return "refused"


def tcp_open(host, address: str, port: int, timeout: float = 3) -> bool:
    """Whether a TCP connection from the target host to address:port is accepted."""
    return tcp_state(host, address, port, timeout) == "open"
