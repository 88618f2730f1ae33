"""Readers of the InfiniBand diagnostics' text output (`ibstat`, `ibv_devinfo`), for the verify
suite: what each port says of its state, rate and link layer."""

from __future__ import annotations

import re
from dataclasses import dataclass

# ibstat prints the rate as a bare number of Gb/s ("Rate: 200"); sysfs and ibv_devinfo -v
# print "200 Gb/sec (4X HDR)".
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)")


@dataclass(frozen=True)
class PortStatus:
    """One HCA port as a diagnostic tool reported it."""

    device: str
    port: int
    state: str  # "Active", "Down", "Initializing", "Armed" (ibstat's words)
    rate_gbps: float | None  # None where the tool does not print a rate (ibv_devinfo)
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    physical_state: str = ""  # "LinkUp", "Polling", "Disabled" (ibstat only)

    @property
    def active(self) -> bool:
        return self.state.lower() == "active"


def parse_ibstat(text: str) -> dict[tuple[str, int], PortStatus]:
    """(device, port) -> status from `ibstat` (every CA) or `ibstat DEVICE`. Its shape:

    CA 'mlx5_0'
            CA type: MT4123
            ...
            Port 1:
                    State: Active
                    Physical state: LinkUp
                    Rate: 200
                    ...
                    Link layer: InfiniBand
    """
    found: dict[tuple[str, int], PortStatus] = {}
    device: str | None = None
    port: int | None = None
    fields: dict[str, str] = {}

    def close() -> None:
        if device is not None and port is not None:
            rate = _RATE.match(fields.get("Rate", ""))
            found[(device, port)] = PortStatus(
                device,
                port,
                fields.get("State", ""),
                float(rate.group(1)) if rate else None,
                fields.get("Link layer", ""),
                fields.get("Physical state", ""),
            )

    for line in text.splitlines():
        stripped = line.strip()
        ca = re.match(r"^CA '([^']+)'$", stripped)
        if ca:
            close()
            device, port, fields = ca.group(1), None, {}
            continue
        numbered = re.match(r"^Port ([0-9]+):$", stripped)
        if numbered:
            close()
            port, fields = int(numbered.group(1)), {}
            continue
        key, sep, value = stripped.partition(":")
        if sep and port is not None:
            fields[key.strip()] = value.strip()
    close()
    return found


# ibv_devinfo's port states: "PORT_ACTIVE (4)" -> ibstat's word.
_VERBS_STATES = {
    "PORT_NOP": "Nop",
    "PORT_DOWN": "Down",
    "PORT_INIT": "Initializing",
    "PORT_ARMED": "Armed",
    "PORT_ACTIVE": "Active",
    "PORT_ACTIVE_DEFER": "ActiveDefer",
}


def parse_ibv_devinfo(text: str) -> dict[tuple[str, int], PortStatus]:
    """(device, port) -> status from `ibv_devinfo` (no rate: only `-v` prints the width and
    speed). Its shape:

        hca_id: mlx5_0
                transport:                      InfiniBand (0)
                ...
                        port:   1
                                state:                  PORT_ACTIVE (4)
                                ...
                                link_layer:             InfiniBand
    """
    found: dict[tuple[str, int], PortStatus] = {}
    device: str | None = None
    port: int | None = None
    fields: dict[str, str] = {}

    def close() -> None:
        if device is not None and port is not None:
            state = fields.get("state", "").split(" ")[0]
            found[(device, port)] = PortStatus(
                device, port, _VERBS_STATES.get(state, state), None, fields.get("link_layer", "")
            )

    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            close()
            device, port, fields = value, None, {}
        elif key == "port" and value.isdigit():
            close()
            port, fields = int(value), {}
        elif port is not None:
            fields[key] = value
    close()
    return found


LINK_LAYERS = {"infiniband": "InfiniBand", "ethernet": "Ethernet"}


def port_problems(
    status: PortStatus | None, device: str, port: int, rate_gbps: int, link_layer: str
) -> list[str]:
    """What is wrong with a port against what the inventory expects (empty: nothing)."""
    name = f"{device} port {port}"
    if status is None:
        return [f"{name}: not reported (no such device or port)"]
    problems = []
    if not status.active:
        physical = f", physical state {status.physical_state}" if status.physical_state else ""
        problems.append(f"{name}: state {status.state or 'unknown'}{physical}, not Active")
    if status.rate_gbps is not None and status.rate_gbps != rate_gbps:
        problems.append(f"{name}: rate {status.rate_gbps:g} Gb/s, expected {rate_gbps}")
    wanted = LINK_LAYERS[link_layer]
    if status.link_layer != wanted:
        problems.append(f"{name}: link layer {status.link_layer or 'unknown'}, expected {wanted}")
    return problems
