"""pyinfra operations of the etcd role: the data disk, the disk gate and the installation.

Each decides inside itself what a host needs (a disk or none, fresh or already a member), so
every etcd host runs the same sequence of operations, as pyinfra requires.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Mounts

from roles.etcd.config import EtcdConfig
from roles.etcd.facts import BlockDevice, EtcdInstalled, FstabEntry, Machine, MemberData
from roles.etcd.gate import fio_command, judge
from roles.etcd.release import binary_dir, release
from toolkit import record
from toolkit.facts import UnitState
from toolkit.operations import start_command

LABEL = "gpuinfra-etcd"  # a filesystem with this label was made by us: safe to mount as ours


def refusal(device: str, probe: dict[str, str]) -> str | None:
    """Why a device must not be formatted or used, or None when it is blank or ours."""
    if probe.get("PTTYPE"):
        return f"{device} holds a {probe['PTTYPE']} partition table"
    kind = probe.get("TYPE")
    if kind and probe.get("LABEL") != LABEL:
        label = f" labelled {probe['LABEL']!r}" if probe.get("LABEL") else ""
        return f"{device} already holds a {kind} filesystem{label} (UUID {probe.get('UUID', '?')})"
    return None


@operation()
def data_disk(device: str | None, mountpoint: str, filesystem: str = "ext4"):
    """Format a blank device (never one holding anything), mount it by UUID with noatime at the
    data directory, and keep it in /etc/fstab. Without a device: nothing to do."""
    if device is None:
        host.noop("no etcd.disk: the data directory is a plain directory")
        return
    probe = host.get_fact(BlockDevice, device=device)
    if probe is None:
        raise OperationError(f"etcd.disk {device} is not a block device on this host")
    reason = refusal(device, probe)
    if reason:
        raise OperationError(f"refusing to format: {reason}; wipe it or set another etcd.disk")
    dev, mnt = shlex.quote(device), shlex.quote(mountpoint)
    if not probe.get("TYPE"):
        mkfs = "mkfs.xfs -q -L" if filesystem == "xfs" else "mkfs.ext4 -q -L"
        yield f"{mkfs} {LABEL} {dev}"
    uuid = probe.get("UUID")
    wanted = f"UUID={uuid} {mountpoint} {filesystem} noatime,nofail 0 2" if uuid else None
    if wanted is None or host.get_fact(FstabEntry, path=mountpoint) != wanted:
        # The UUID of a filesystem made just now is read back on the host.
        yield (
            f'uuid=$(blkid -s UUID -o value {dev}) && test -n "$uuid" && '
            f"awk -v p={mnt} '!($1 !~ /^#/ && $2 == p)' /etc/fstab > /etc/fstab.gpuinfra && "
            f'echo "UUID=$uuid {mountpoint} {filesystem} noatime,nofail 0 2" '
            ">> /etc/fstab.gpuinfra && mv /etc/fstab.gpuinfra /etc/fstab"
        )
    mounted = host.get_fact(Mounts).get(mountpoint)
    if mounted is None:
        # blkid fills its cache so the fstab UUID resolves even without udev; "nofail" makes
        # mount(8) succeed silently on a missing disk, hence the check after it.
        yield f"mkdir -p {mnt} && blkid {dev} >/dev/null && mount {mnt} && mountpoint -q {mnt}"
    elif "noatime" not in mounted["options"]:
        yield f"mount -o remount,noatime {mnt}"


def _gate_results(state) -> dict[str, object]:
    """Every member's disk gate result of this run, shared by the members' barrier."""
    return record.current().shared.setdefault("etcd_gate", {})


def _record_check(target, check: dict) -> None:
    record.host(target.name).checks.append(check)


@operation()
def disk_gate(data_dir: str, limit_ms: float, override: bool):
    """fio's fdatasync test on the data directory before etcd first starts here; a member that
    already holds data was gated when it was set up (and re-checked by `etcd check-disk`)."""
    if host.get_fact(MemberData, data_dir=data_dir):
        host.noop("member data present: gated when it was set up")
        return

    def run_gate(state, host) -> bool:
        ok, output = host.run_shell_command(StringCommand(fio_command(data_dir)), _timeout=600)
        text = output.stdout if ok else "\n".join(line.line for line in output)
        result = judge(host.name, data_dir, text, ok, limit_ms, override)
        _gate_results(state)[host.name] = result
        _record_check(host, result.to_check())
        return result.status in ("pass", "override")

    yield FunctionCommand(run_gate, (), {})


@operation()
def disk_gate_barrier(data_dir: str):
    """Stop etcd on every host of the phase when any member failed the disk gate: a cluster
    must not bootstrap with a member on a disk that cannot keep up."""
    if host.get_fact(MemberData, data_dir=data_dir):
        host.noop("member data present")
        return

    def barrier(state, host) -> bool:
        failed = [r for r in _gate_results(state).values() if r.status in ("fail", "error")]
        if failed:
            names = "; ".join(f"{r.host}: {r.detail}" for r in failed)
            detail = f"etcd phase stopped, disk gate failed on {names}"
            _record_check(
                host, {"check": "etcd disk gate barrier", "status": "fail", "detail": detail}
            )
            return False
        return True

    yield FunctionCommand(barrier, (), {})


@operation()
def etcd_installed(cfg: EtcdConfig, version: str):
    """etcd, etcdctl and etcdutl at the pinned version: the distribution's packages, or the
    release tarball checked against its SHA-256 before anything is unpacked."""
    bin_dir = binary_dir(cfg)
    if cfg.source == "distribution":
        # dpkg's list, which every host's roles read already (toolkit/operations.py prefetch): no
        # dpkg-query of its own. An installed or held package only, never one removed with its
        # configuration left.
        packages = host.get_fact(DebPackages) or {}
        versions = sorted(packages.get("etcd-server", ()))
        installed = versions[0] if versions else None
        # etcdctl and etcdutl come with etcd-client: the backup, the health checks and every
        # day-2 command need them, so a member without it is not installed.
        client = sorted(packages.get("etcd-client", ()))
        if installed and (not client or client[0] != installed):
            installed = None
    else:
        installed = host.get_fact(EtcdInstalled, binary_dir=bin_dir)
    if installed and installed.split("-")[0].split("+")[0] == version:
        host.noop(f"etcd {installed} installed")
        return
    if cfg.source == "distribution":
        install = (
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            f"-o Dpkg::Options::=--force-confold etcd-server={shlex.quote(version)}* "
            f"etcd-client={shlex.quote(version)}*"
        )
        if installed:
            # An upgrade: the package would restart etcd on every member at once. Hold that back
            # (policy-rc.d, exit 101) and let the role's serial restart roll the new version.
            install = (
                "test ! -e /usr/sbin/policy-rc.d || mv /usr/sbin/policy-rc.d "
                "/usr/sbin/policy-rc.d.gpuinfra; printf '#!/bin/sh\\nexit 101\\n' > "
                "/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d && "
                f"{{ {install}; rc=$?; rm -f /usr/sbin/policy-rc.d; "
                "test ! -e /usr/sbin/policy-rc.d.gpuinfra || mv /usr/sbin/policy-rc.d.gpuinfra "
                "/usr/sbin/policy-rc.d; exit $rc; }"
            )
        yield install
        return
    rel = release(cfg, version, host.get_fact(Machine))
    tarball = f"/var/tmp/{rel.folder}.tar.gz"
    yield f"curl -fsSL --retry 3 -o {tarball} {shlex.quote(rel.url)}"
    yield (
        f"echo '{rel.sha256}  {tarball}' | sha256sum -c --quiet - || "
        f"{{ rm -f {tarball}; echo 'etcd download: SHA-256 mismatch' >&2; exit 1; }}"
    )
    yield (
        f"tar -xzf {tarball} -C {bin_dir} --strip-components=1 --no-same-owner "
        f"{rel.folder}/etcd {rel.folder}/etcdctl {rel.folder}/etcdutl && rm -f {tarball}"
    )


@operation()
def unit_running(unit: str):
    """Enable and start a unit this role writes itself: on a first run the unit file is only
    uploaded by an earlier operation of the same run, so a missing unit is started too."""
    state = host.get_fact(UnitState, unit=unit) or {}
    if state.get("UnitFileState") not in ("enabled", "static", "alias"):  # not enabled-runtime
        yield f"systemctl enable {unit}"
    if state.get("ActiveState") != "active":
        yield start_command(unit)
