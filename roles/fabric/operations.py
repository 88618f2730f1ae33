"""Operations of the fabric role. Each decides per host inside itself (ports declared or not,
a lab stand-in), so every fabric host runs the same sequence of operations."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from roles.fabric.facts import SYSFS, FabricPorts
from toolkit.operations import report_note


def missing_ports_message(missing: list[tuple[str, int]]) -> str:
    names = ", ".join(f"{device} port {port}" for device, port in missing)
    return (
        f"fabric: {names} not found (no {SYSFS}/DEVICE/ports/PORT): is the HCA installed and "
        "its driver loaded? (fabric.ports in the inventory names them)"
    )


@operation()
def ports_present(ports: tuple[tuple[str, int], ...], standin: bool):
    """Every declared HCA port must exist. A real server without them fails here, before the
    role changes anything, with one line naming them; a host declared a stand-in
    (`fabric.device_standin`: the lab, which has no RDMA device) gets a note instead, and the
    rest of the role runs as it would on hardware."""
    if not ports:
        return
    found = host.get_fact(FabricPorts, ports=ports) or {}
    missing = [port for port in ports if not found.get(port)]
    if not missing:
        return
    message = missing_ports_message(missing)
    if standin:
        report_note(f"{message} -- stand-in host (fabric.device_standin): not checked here")
        return
    yield f"echo {shlex.quote(message)} >&2; exit 1"
