"""What a lab recorded about itself (slot, hosts, inventory path), and the locks around it."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lab import addressing, naming
from lab.errors import LabError, LabInvalid
from lab.naming import LabNames
from lab.topology import HostSpec, Topology
from toolkit.statefiles import write_secret_atomically

STATE_FILE = "lab.json"
PRIVATE_KEY = "id_ed25519"
KNOWN_HOSTS = "known_hosts"


@dataclass(frozen=True)
class LabState:
    name: str
    slot: int
    topology: Topology
    inventory_path: Path | None = None
    # A saved host root (`lab save-layer`) laid between the shared Debian root and each host's
    # own changes: hosts start from an already converged state (scale benchmarks).
    layer: Path | None = None
    # Whether the lab runs Kubernetes: its nodes run containers (lab/host.py) and the inventory
    # installs the machine's Kubernetes build. Off, the kubernetes role is off as well.
    kubernetes: bool = True

    def runs_containers(self, spec: HostSpec) -> bool:
        return self.kubernetes and spec.runs_containers

    @property
    def runs_kubernetes_nodes(self) -> bool:
        return any(self.runs_containers(spec) for spec in self.topology.hosts)

    @property
    def etcd_from_build(self) -> bool:
        """Whether the etcd members install this machine's etcd build, served by the lab's file
        server (the sample's line), rather than Debian's package."""
        members = any("etcd" in spec.groups for spec in self.topology.hosts)
        return members and (self.runs_kubernetes_nodes or self.topology.etcd_build)

    @property
    def names(self) -> LabNames:
        return LabNames(self.name, self.slot)

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return addressing.subnet_of(self.slot)

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return addressing.gateway(self.subnet)

    @property
    def vip(self) -> ipaddress.IPv4Address | None:
        return addressing.virtual_address(self.subnet) if self.topology.needs_vip else None

    @property
    def private_key(self) -> Path:
        return self.names.state_dir / PRIVATE_KEY

    @property
    def known_hosts(self) -> Path:
        return self.names.state_dir / KNOWN_HOSTS

    @property
    def domain(self) -> str:
        # .test is reserved (RFC 2606): lab names can never resolve anywhere real.
        return f"{self.name}.gpuinfra.test"

    def hosts(self) -> Iterator[tuple[int, HostSpec, ipaddress.IPv4Address]]:
        """(index, spec, address) of every host, in address order."""
        for index, host in enumerate(self.topology.hosts):
            yield index, host, addressing.host_address(self.subnet, index)

    def host_at(self, index: int) -> tuple[int, HostSpec, ipaddress.IPv4Address]:
        return index, self.topology.hosts[index], addressing.host_address(self.subnet, index)

    def host(self, name: str) -> tuple[int, HostSpec, ipaddress.IPv4Address]:
        for index, spec, address in self.hosts():
            if spec.name == name:
                return index, spec, address
        names = self.topology.names()
        known = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        raise LabInvalid(f"lab {self.name} has no host {name!r} (hosts: {known})")

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "slot": self.slot,
            "subnet": str(self.subnet),
            "inventory_path": str(self.inventory_path) if self.inventory_path else None,
            "topology": self.topology.to_json(),
            "layer": str(self.layer) if self.layer else None,
            "kubernetes": self.kubernetes,
        }

    @classmethod
    def from_json(cls, data: dict) -> LabState:
        inventory = data.get("inventory_path")
        return cls(
            name=data["name"],
            slot=data["slot"],
            topology=Topology.from_json(data["topology"]),
            inventory_path=Path(inventory) if inventory else None,
            layer=Path(data["layer"]) if data.get("layer") else None,
            kubernetes=data.get("kubernetes", False),  # labs from before it ran none
        )


def state_path(name: str) -> Path:
    return naming.LABS_DIR / name / STATE_FILE


def read_state(name: str) -> LabState | None:
    path = state_path(name)
    try:
        return LabState.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise LabError(
            f"{path} is unreadable ({exc}): run `gpuinfra lab down --name {name}`"
        ) from None


def write_state(state: LabState) -> None:
    path = state_path(state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)  # it holds the lab's private key and every host's root
    # Atomic: a crash leaves the old state or the new, never half; private like its folder.
    write_secret_atomically(path, (json.dumps(state.to_json(), indent=2) + "\n").encode())


def recorded_labs() -> list[LabState]:
    labs = []
    for path in sorted(naming.LABS_DIR.glob(f"*/{STATE_FILE}")):
        state = read_state(path.parent.name)
        if state is not None:
            labs.append(state)
    return labs


def lock_path(name: str | None) -> Path:
    return naming.LABS_DIR / (f".{name}.lock" if name else ".slots.lock")


@contextmanager
def locked(name: str | None, *, remove: bool = False) -> Iterator[None]:
    """Serialise changes: one lab's up/down/stop at a time; None locks the address plan.

    `remove=True` (lab down) deletes the lock file while still holding it. A process that was
    waiting on that file then holds a lock on an unlinked inode that nobody else can see, so
    every holder checks, once it has the lock, that the path still names the file it locked,
    and starts again on the new file otherwise: two holders at once are impossible."""
    naming.LABS_DIR.mkdir(parents=True, exist_ok=True)
    path = lock_path(name)
    while True:
        lock = open(path, "a")  # noqa: SIM115 (closed below, after the lock is released)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            held = os.fstat(lock.fileno())
            if current is None or (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
                continue  # locked a file another holder removed: lock the one the path names
            try:
                yield
            finally:
                if remove:
                    path.unlink(missing_ok=True)
            return
        finally:
            lock.close()


MACHINE_LOCK = ".machine.lock"


@contextmanager
def machine_locked() -> Iterator[None]:
    """Serialise what every lab on the machine shares (its sysctls, the package cache, the image
    registry and file server): two labs coming up at once would each find the cache not running
    and start it, and the second start fails on the taken port. Never removed, so no waiter is
    left on an unlinked file (see `locked`)."""
    naming.LABS_DIR.mkdir(parents=True, exist_ok=True)
    with open(naming.LABS_DIR / MACHINE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
