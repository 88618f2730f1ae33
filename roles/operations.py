"""Operations shared by the roles: managed files and services that respect containers."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.server import Hostname
from pyinfra.operations import files

from roles.facts import Container, UnitState
from roles.render import ManagedFile


def put_file(managed: ManagedFile) -> OperationMeta:
    """Upload a rendered file; the runner turns a pending change into a unified diff."""
    meta = files.put(
        name=f"Write {managed.path}",
        src=StringIO(managed.content),
        dest=managed.path,
        user=managed.user,
        group=managed.group,
        mode=managed.mode,
        create_remote_dir=True,
    )
    # Remembered by operation hash so the runner can diff exactly this file on this host.
    if not hasattr(host, "_gpuinfra_files"):
        host._gpuinfra_files = {}
    host._gpuinfra_files[meta._hash] = managed
    return meta


@operation()
def service_running(unit: str, container_skips: bool = False):
    """Enable and start a unit. Units that cannot work in a container (chrony cannot set the
    clock there) are reported and left alone when `container_skips` is set."""
    if container_skips and host.get_fact(Container):
        host.noop(f"{unit} does not run in a container ({host.get_fact(Container)})")
        return
    state = host.get_fact(UnitState, unit=unit)
    if state is None:
        raise ValueError(f"systemd unit {unit} is not installed")
    if state.get("UnitFileState") not in ("enabled", "static", "alias", "enabled-runtime"):
        yield f"systemctl enable {unit}"
    if state.get("ActiveState") != "active":
        yield f"systemctl start {unit}"


@operation()
def live_hostname(hostname: str):
    """Set the running hostname (the /etc/hostname file is a managed file of its own)."""
    if host.get_fact(Hostname) != hostname:
        yield f"hostname {hostname}"
