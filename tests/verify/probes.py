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


class ControlFailed(AssertionError):
    """The positive control of a negative probe failed: the target did not answer on a port
    it must answer on, so "no answer" on the probed port proves nothing (the target may be
    powered off or cut off)."""


def dropped_port_state(host, address: str, port: int, control_port: int) -> TcpState:
    """tcp_state of a port the firewall should drop, right after a positive control against
    the same target from the same host: `control_port` (SSH, which every cluster host admits
    from the node network) must be "open", or ControlFailed is raised. A "filtered" answer
    counts only when the target is shown to be up and reachable a moment before."""
    control = tcp_state(host, address, control_port)
    if control != "open":
        raise ControlFailed(
            f"positive control failed: {address}:{control_port} is {control} from this host; "
            f"a dropped port {port} on a target that does not answer proves nothing"
        )
    return tcp_state(host, address, port)
