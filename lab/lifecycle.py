"""Bring a lab up, take it down, and change it while it runs: what `gpuinfra lab` commands call."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from lab import addressing, aptcache, fleet, host, naming, network, offline, processes, rootfs
from lab.errors import LabError, LabInvalid
from lab.host import HostPaths
from lab.memory import host_memory
from lab.naming import LabNames, check_lab_name
from lab.state import (
    LabState,
    locked,
    machine_locked,
    read_state,
    recorded_labs,
    write_state,
)
from lab.system import require_root_and_tools, run, succeeds
from lab.topology import DEFAULT_PARALLEL, Topology, default_topology
from toolkit.statefiles import write_secret_atomically

if TYPE_CHECKING:
    from inventory.model import LoadedCluster

# lab.inventory (the inventory model, YAML) is imported where it is used: `gpuinfra --help`
# and `lab status` must not pay for it.

BOOT_TIMEOUT_S = 300.0
# LAB.md: 82 of 84 hosts powered off within 15 s of SIGTERM; the rest need SIGKILL.
STOP_DEADLINE_S = 20.0
# Preparing roots and keys is I/O and ssh-keygen: a few threads are plenty.
PREPARE_THREADS = 8

Progress = Callable[[str, str], None]  # (host, event): "prepared", "ready", "running", "failed"


@dataclass(frozen=True)
class UpResult:
    name: str
    inventory_path: Path
    subnet: str
    hosts: int
    started: list[str]
    already_running: list[str]
    seconds: float  # from the command's start until every host answered SSH
    rootfs_build_seconds: float | None  # None: the cached root was used


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    groups: list[str]
    running: bool
    ssh: bool  # sshd answered with its banner
    partitioned: bool
    memory_bytes: int | None  # proportional set size of the host's processes
    disk: str | None  # the loop device behind /dev/vdb


@dataclass(frozen=True)
class LabStatus:
    name: str
    subnet: str
    bridge: str
    inventory_path: str | None
    hosts: list[HostStatus] = field(default_factory=list)


@dataclass(frozen=True)
class DownResult:
    name: str
    removed: list[str]  # what was found and removed, one short phrase each
    killed: list[int]  # processes that needed SIGKILL after the deadline


def default_inventory_path(name: str) -> Path:
    return Path.cwd() / "inventory" / name / "cluster.yml"


def up(
    name: str,
    topology: Topology | None = None,
    *,
    inventory_path: Path | None = None,
    mirror: rootfs.Mirror | None = None,
    parallel: int = DEFAULT_PARALLEL,
    boot_timeout_s: float = BOOT_TIMEOUT_S,
    progress: Progress | None = None,
    layer: Path | None = None,
    kubernetes: bool | None = None,
) -> UpResult:
    """Boot every host of the lab that is not running, wait for SSH, write the inventory.

    Idempotent: hosts already running are left alone, so after a failure it simply resumes.
    Without a topology an existing lab keeps its own, and a new one gets the default; the same
    holds for `kubernetes` (a new lab runs Kubernetes unless told not to).
    """
    started_at = time.monotonic()
    check_lab_name(name)
    require_root_and_tools()
    with locked(name):
        mirror = mirror or rootfs.machine_mirror()
        lower, build_seconds = rootfs.ensure_root(mirror)
        state = _resolve_state(name, topology, inventory_path, layer, kubernetes)
        _ensure_lab_key(state)
        containers = state.runs_kubernetes_nodes
        services: dict[int, str] = {}
        with machine_locked():
            network.tune_machine()
            if containers:
                network.tune_machine_for_kubelet()
            if aptcache.available():
                aptcache.ensure_running(mirror)
                services[aptcache.PORT] = "the package cache"
            if containers or state.etcd_from_build:
                offline.ensure_running()
                offline.publish_all(mirror)
                services[offline.FILES_PORT] = "the file server"
            if containers:
                services[offline.REGISTRY_PORT] = "the image registry"
        network.ensure_bridge(state.names, state.gateway, state.subnet.prefixlen)
        network.ensure_nat(state.names, state.subnet, state.gateway, services)
        mirror_hosts = rootfs.resolve_mirror(mirror)
        sources = _apt_sources(mirror)
        public_key = Path(f"{state.private_key}.pub").read_text()

        def prepare(index: int) -> str:
            _, spec, address = state.host_at(index)
            paths = _paths(state, spec.name)
            host.ensure_root_mounted(paths, lower, state.layer)
            host.write_identity(
                paths, spec.name, state.domain, address, mirror_hosts, sources, public_key
            )
            if state.runs_containers(spec):
                host.write_container_support(paths)
            return f"{address} {host.host_public_key(paths)}"

        with ThreadPoolExecutor(PREPARE_THREADS) as pool:
            known = list(pool.map(prepare, range(len(state.topology.hosts))))
        _write_private(state.known_hosts, "\n".join(known) + "\n")
        assert state.inventory_path is not None
        from lab.inventory import write_inventory

        write_inventory(state, state.inventory_path)

        def boot(index: int) -> tuple[str, bool]:
            _, spec, address = state.host_at(index)
            already = _boot(state, index)
            if not _wait_for_ssh(address, time.monotonic() + boot_timeout_s):
                if progress:
                    progress(spec.name, "failed")
                raise LabError(
                    f"{spec.name} ({address}) did not answer SSH within {boot_timeout_s:.0f} s; "
                    f"see {_paths(state, spec.name) / host.CONSOLE_LOG}"
                )
            if progress:
                progress(spec.name, "running" if already else "ready")
            return spec.name, already

        results, failures = _each(boot, range(len(state.topology.hosts)), parallel)
        if failures:
            raise LabError(
                f"{len(failures)} of {len(state.topology.hosts)} hosts failed: {failures[0]}"
                " (rerun `gpuinfra lab up` to resume)"
            )
        return UpResult(
            name=name,
            inventory_path=state.inventory_path,
            subnet=str(state.subnet),
            hosts=len(state.topology.hosts),
            started=[host_name for host_name, already in results if not already],
            already_running=[host_name for host_name, already in results if already],
            seconds=time.monotonic() - started_at,
            rootfs_build_seconds=build_seconds,
        )


def _resolve_state(
    name: str,
    topology: Topology | None,
    inventory_path: Path | None,
    layer: Path | None = None,
    kubernetes: bool | None = None,
) -> LabState:
    if layer is not None and not layer.is_dir():
        raise LabInvalid(
            f"--layer {layer}: no such folder (make one with `gpuinfra lab save-layer`)"
        )
    if layer is not None and re.search(r"[:,\s]", str(layer.absolute())):
        # The path goes into the overlay mount's options, where these characters separate.
        raise LabInvalid(f"--layer {layer}: the path must not hold ':', ',' or spaces")
    existing = read_state(name)
    if existing is not None:
        if layer is not None and layer.absolute() != existing.layer:
            raise LabInvalid(
                f"lab {name} is already up without the layer {layer}: run "
                f"`gpuinfra lab down --name {name}` first, or use another --name"
            )
        if topology is not None and topology != existing.topology:
            raise LabInvalid(
                f"lab {name} is already up with other hosts ({existing.topology.kind}, "
                f"{len(existing.topology.hosts)} hosts): run `gpuinfra lab down --name {name}` "
                "first, or use another --name"
            )
        if kubernetes is not None and kubernetes != existing.kubernetes:
            running = "with" if existing.kubernetes else "without"
            raise LabInvalid(
                f"lab {name} is already up {running} Kubernetes: run `gpuinfra lab down --name "
                f"{name}` first, or use another --name"
            )
        state = existing
        if inventory_path is not None or state.inventory_path is None:
            path = (inventory_path or default_inventory_path(name)).absolute()
            state = replace(state, inventory_path=path)
        write_state(state)
        return state
    topology = topology or default_topology()
    if len(topology.hosts) > addressing.max_hosts():
        raise LabInvalid(f"a lab holds at most {addressing.max_hosts()} hosts")
    path = (inventory_path or default_inventory_path(name)).absolute()
    with locked(None):
        slot = addressing.free_slot(_used_slots())
        state = LabState(
            name,
            slot,
            topology,
            path,
            layer.absolute() if layer else None,
            kubernetes=True if kubernetes is None else kubernetes,
        )
        write_state(state)  # recorded at once: a second lab now sees this slot as taken
    return state


def _used_slots() -> set[int]:
    """Slots recorded by labs, plus any lab-range address or lab bridge on the machine."""
    used = {lab.slot for lab in recorded_labs()}
    addresses = json.loads(run(["ip", "-j", "addr", "show"]) or "[]")
    for link in addresses:
        match = re.fullmatch(r"glab(\d+)", link.get("ifname", ""))
        if match:
            used.add(int(match.group(1)))
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                slot = addressing.slot_of(ipaddress.IPv4Address(info["local"]))
                if slot is not None:
                    used.add(slot)
    return used


def _ensure_lab_key(state: LabState) -> None:
    """The lab's own SSH key: authorised for root on its hosts, never printed, mode 0600."""
    key = state.private_key
    if key.exists() and Path(f"{key}.pub").exists():
        return
    key.unlink(missing_ok=True)
    comment = f"gpuinfra-lab-{state.name}"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    key.chmod(0o600)


def _write_private(path: Path, text: str) -> None:
    write_secret_atomically(path, text.encode())


def _apt_sources(mirror: rootfs.Mirror) -> str:
    """deb822 sources for the hosts: the machine's mirror, with non-free (NVIDIA's packages)."""
    components = "main contrib non-free non-free-firmware"
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    suite = rootfs.SUITE
    stanzas = [
        f"Types: deb\nURIs: {mirror.archive}\nSuites: {suite} {suite}-updates\n"
        f"Components: {components}\nSigned-By: {keyring}\n"
    ]
    if mirror.security:
        stanzas.append(
            f"Types: deb\nURIs: {mirror.security}\nSuites: {suite}-security\n"
            f"Components: {components}\nSigned-By: {keyring}\n"
        )
    return "\n".join(stanzas)


def _paths(state: LabState, host_name: str) -> HostPaths:
    return HostPaths(state.names.host_dir(host_name))


def _boot(state: LabState, index: int) -> bool:
    """Start one host unless it runs; returns whether it was already running."""
    _, spec, address = state.host_at(index)
    paths = _paths(state, spec.name)
    if host.is_running(paths):
        return True
    host.kill_orphans(paths)  # a host whose systemd-nspawn was killed must not run twice
    network.ensure_host_network(state.names, spec.name, index, address, state.subnet, state.gateway)
    loops = host.ensure_disks(paths, spec.disk_sizes)
    host.start(paths, state.names, spec.name, loops, state.runs_containers(spec))
    return False


def _wait_for_ssh(address: ipaddress.IPv4Address, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if ssh_answers(address):
            return True
        time.sleep(0.5)
    return False


def ssh_answers(address: ipaddress.IPv4Address, timeout_s: float = 2.0) -> bool:
    """Whether sshd on the host sends its banner (a bound port alone is not enough)."""
    try:
        with socket.create_connection((str(address), 22), timeout=timeout_s) as connection:
            connection.settimeout(timeout_s)
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _each(work, items, threads: int) -> tuple[list, list[str]]:
    """Run work on every item with bounded threads; (results, failure messages)."""
    results, failures = [], []
    with ThreadPoolExecutor(max(1, threads)) as pool:
        futures = [pool.submit(work, item) for item in items]
        for future in futures:
            try:
                results.append(future.result())
            except (LabError, OSError, subprocess.SubprocessError) as exc:
                failures.append(str(exc))
    return results, failures


def _state(name: str) -> LabState:
    check_lab_name(name)
    state = read_state(name)
    if state is None:
        raise LabInvalid(f"no lab named {name}: start it with `gpuinfra lab up --name {name}`")
    return state


def down(name: str, *, deadline_s: float = STOP_DEADLINE_S) -> DownResult:
    """Remove everything the lab made, from its state and by its naming scheme (after a crash)."""
    check_lab_name(name)
    require_root_and_tools(("ip", "nft", "losetup"))
    removed: list[str] = []
    state_dir = naming.LABS_DIR / name
    # The lock file goes with the lab, removed while still held (see lab.state.locked).
    with locked(name, remove=True):
        try:
            state = read_state(name)
        except LabError:
            state = None  # unreadable: everything below works by naming scheme alone
        # The simulated nodes' kwok first: it would only log errors once the API is gone.
        if fleet.stop_controller(name):
            removed.append("kwok")
        hosts_dir = state_dir / "hosts"
        host_dirs = sorted(hosts_dir.iterdir()) if hosts_dir.is_dir() else []
        for paths in (HostPaths(folder) for folder in host_dirs):
            host.request_stop(paths)
        # By command line too: a lost pid file must not leave a host running.
        nspawns = [
            pid
            for pid, cmdline in processes.with_cmdline_under(state_dir).items()
            if cmdline.startswith("systemd-nspawn")
        ]
        for pid in nspawns:
            processes.send(pid, signal.SIGTERM)
        killed = processes.stop(nspawns, deadline_s)
        if nspawns:
            removed.append(f"{len(nspawns)} hosts stopped")
        # Supervisors, and hosts whose systemd-nspawn died before us (found by their root).
        leftovers = list(processes.with_cmdline_under(state_dir))
        leftovers += processes.with_root_under(state_dir)
        processes.kill_all(leftovers)
        if leftovers:
            removed.append(f"{len(leftovers)} leftover processes")
        for folder in host_dirs:
            host.remove_own_cgroups(name, folder.name)
        mounts = sorted(
            (point for point in host.mounted_paths() if point.startswith(f"{state_dir}/")),
            key=len,
            reverse=True,
        )
        for point in mounts:
            if not succeeds(["umount", point]):
                run(["umount", "--lazy", point])
        if mounts:
            removed.append(f"{len(mounts)} mounts")
        loops = host.loop_devices_under(state_dir)
        for device in loops:
            run(["losetup", "--detach", device])
        if loops:
            removed.append(f"{len(loops)} loop devices")
        netns, links = network.lab_netns(name), network.lab_links(name)
        table = network.nft_table_exists(name)
        network.remove_network(name)
        if netns:
            removed.append(f"{len(netns)} network namespaces")
        if links:
            removed.append(f"{len(links)} links")
        if table:
            removed.append(f"nft table {LabNames(name, 0).nft_table}")
        still = [point for point in host.mounted_paths() if point.startswith(f"{state_dir}/")]
        if still:
            raise LabError(f"{still[0]} is still mounted: not removing {state_dir}")
        if state is not None and state.inventory_path is not None and _remove_inventory(state):
            removed.append(f"inventory {state.inventory_path}")
        if state_dir.exists():
            shutil.rmtree(state_dir)
            removed.append(f"state {state_dir}")
    return DownResult(name, removed, killed)


def _remove_inventory(state: LabState) -> bool:
    """Delete the lab's cluster.yml (its key goes with the lab), never a file we did not write."""
    path = state.inventory_path
    assert path is not None
    from lab.inventory import HEADER

    header = HEADER.splitlines()[0].format(name=state.name)
    try:
        if not path.read_text().startswith(header):
            return False
    except OSError:
        return False
    path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # only when empty: the folder may hold the operator's own files
    return True


def status(name: str) -> LabStatus:
    state = _state(name)
    links = network.link_states(name)
    memory = host_memory({spec.name: _paths(state, spec.name) for _, spec, _ in state.hosts()})

    def host_status(index: int) -> HostStatus:
        _, spec, address = state.host_at(index)
        paths = _paths(state, spec.name)
        running = host.is_running(paths)
        link = links.get(state.names.veth_outside(index), {})
        image = paths / host.DISK_FILE
        loops = host.loop_devices_of(image) if image.exists() else []
        return HostStatus(
            name=spec.name,
            address=str(address),
            groups=list(spec.groups),
            running=running,
            ssh=running and ssh_answers(address, timeout_s=1.0),
            partitioned=bool(link) and "UP" not in link.get("flags", []),
            memory_bytes=memory.get(spec.name),
            disk=loops[0] if loops else None,
        )

    with ThreadPoolExecutor(16) as pool:
        hosts = list(pool.map(host_status, range(len(state.topology.hosts))))
    return LabStatus(
        name=name,
        subnet=str(state.subnet),
        bridge=state.names.bridge,
        inventory_path=str(state.inventory_path) if state.inventory_path else None,
        hosts=hosts,
    )


def stop_host(name: str, host_name: str, *, deadline_s: float = STOP_DEADLINE_S) -> bool:
    """Power a host off (it stays off until `lab start`); returns whether it was running."""
    require_root_and_tools(("ip",))
    with locked(name):
        state = _state(name)
        state.host(host_name)
        paths = _paths(state, host_name)
        pid = host.request_stop(paths)
        if pid is not None:
            processes.stop([pid], deadline_s)
        host.kill_orphans(paths)
        return pid is not None


def save_layer(name: str, host_name: str, out: Path) -> Path:
    """Power a host off and save its changes as a layer for `up --layer`: hosts booted on it
    start where this one stands (its packages, files and enabled services), each with its own
    identity. The host stays off."""
    out = out.absolute()
    if out.exists():
        raise LabInvalid(f"{out} exists: give a new folder for the layer")
    stop_host(name, host_name)
    with locked(name):
        state = _state(name)
        host.save_layer(_paths(state, host_name), out)
    return out


def start_host(name: str, host_name: str, *, boot_timeout_s: float = BOOT_TIMEOUT_S) -> bool:
    """Boot a stopped host and wait for SSH; returns whether it was already running."""
    require_root_and_tools()
    with locked(name):
        state = _state(name)
        index, _, address = state.host(host_name)
        lower = rootfs.cached_root()
        host.ensure_root_mounted(_paths(state, host_name), lower, state.layer)
        already = _boot(state, index)
    if not _wait_for_ssh(address, time.monotonic() + boot_timeout_s):
        raise LabError(f"{host_name} did not answer SSH within {boot_timeout_s:.0f} s")
    return already


def partition(name: str, host_name: str, *, partitioned: bool = True) -> None:
    """Cut a host off the lab network (heal with partitioned=False); it keeps running."""
    require_root_and_tools(("ip",))
    state = _state(name)
    index, _, _ = state.host(host_name)
    network.set_partitioned(state.names, index, partitioned)


def attach_disk(name: str, host_name: str, size_bytes: int) -> str:
    """Give a host a block device (/dev/vdb inside); a running host reboots to see it.

    Recorded in the lab's state, and for an etcd host in the inventory as etcd.disk.
    Returns the loop device on the machine.
    """
    require_root_and_tools()
    # Read, change and write the state under one lock: read outside it, a change another
    # command made in between (a host started, a disk attached) would be written over.
    with locked(name):
        state = _state(name)
        state.host(host_name)
        topology = state.topology.with_disks({host_name: size_bytes})
        state = replace(state, topology=topology)  # keeps the layer and the rest
        write_state(state)
        if state.inventory_path is not None:
            from lab.inventory import write_inventory

            write_inventory(state, state.inventory_path)
        loop = host.ensure_disk(_paths(state, host_name), size_bytes)
    if host.is_running(_paths(state, host_name)):
        stop_host(name, host_name)
        start_host(name, host_name)
    return loop


def ssh_argv(name: str, host_name: str, command: list[str], *, batch: bool = True) -> list[str]:
    """The ssh command line to a lab host, with the lab's key and strict host-key checking."""
    from toolkit.ssh import ssh_argv as cluster_ssh_argv

    state = _state(name)
    state.host(host_name)
    return cluster_ssh_argv(cluster(name, state), host_name, batch=batch) + command


def cluster(name: str, state: LabState | None = None) -> LoadedCluster:
    """The lab's validated cluster (the same as loading its cluster.yml)."""
    from lab.inventory import loaded_cluster

    return loaded_cluster(state or _state(name))


def labs() -> list[str]:
    return [state.name for state in recorded_labs()]
