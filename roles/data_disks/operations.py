"""pyinfra operations of the data_disks role, and the judgement of one volume they share.

`judge` decides from the facts alone what a volume needs: the commands that make it (create or
assemble the array, format a blank device, the fstab line by UUID, mount, remount), a refusal
(anything on a disk that is not ours: never wiped) or findings (an array degraded or missing a
member, which no command here can repair). Every host runs the same two operations whatever
its volumes, as pyinfra requires; each loops over the host's volumes inside itself.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, operation

from roles.data_disks.config import Volume
from roles.data_disks.facts import (
    MDADM_CONF,
    ArrayDetail,
    DiskProbe,
    MdadmConfArrays,
    MdStat,
    MountedAt,
)
from roles.data_disks.mdadm import MdDetail
from toolkit.disks import FstabEntry, fstab_command

# Mount options the kernel shows in mountinfo (the others, nofail or x-systemd.*, only mean
# something to mount(8) and systemd, and are checked in /etc/fstab instead).
VISIBLE_OPTIONS = frozenset(
    {"noatime", "nodiratime", "relatime", "strictatime", "nosuid", "nodev", "noexec"}
)


@dataclass
class Judgement:
    """What one volume needs: commands to run, or a refusal, and findings for the health check."""

    commands: list[str] = field(default_factory=list)
    refusal: str | None = None
    findings: list[str] = field(default_factory=list)


# The facts judge reads, as functions of their arguments: the operation passes host.get_fact,
# a unit test a table of recorded answers.
Facts = Callable[..., Any]


def disk_refusal(volume: Volume, disk: str, found: dict, *, member_ok: bool = False) -> str | None:
    """Why a disk must not be used for the volume, or None when it is blank or already ours."""
    probe = found["probe"]
    where = f"{disk} ({found['path']})"
    if probe.get("PTTYPE"):
        return f"{where} holds a {probe['PTTYPE']} partition table"
    mounts = [m for m in found["mounts"] if m != volume.mountpoint]
    if mounts:
        return f"{where} is mounted at {', '.join(mounts)}"
    kind = probe.get("TYPE")
    if kind == "linux_raid_member":
        if member_ok:
            return None
        return f"{where} is a member of the md array {probe.get('LABEL', '?')}"
    if found["holders"]:
        return f"{where} is in use by {', '.join(found['holders'])}"
    if kind and probe.get("LABEL") != volume.label:
        label = f" labelled {probe['LABEL']!r}" if probe.get("LABEL") else ""
        return f"{where} already holds a {kind} filesystem{label} (UUID {probe.get('UUID', '?')})"
    return None


def _ours_member(volume: Volume, found: dict) -> bool:
    """A member of an array of this volume's name (mdadm writes "<homehost>:<name>")."""
    probe = found["probe"]
    label = probe.get("LABEL", "")
    return probe.get("TYPE") == "linux_raid_member" and label.split(":")[-1] == volume.name


def create_command(volume: Volume, members: list[str]) -> str:
    """mdadm --create of a RAID 0 from blank disks (mdadm(8)); --run skips the question mdadm
    asks when a disk looks used, which judge has already answered."""
    disks = " ".join(shlex.quote(disk) for disk in members)
    return (
        f"mdadm --create {volume.array} --name={volume.name} --level=0 "
        f"--chunk={volume.chunk_kib}K --raid-devices={len(members)} --metadata=1.2 --run {disks}"
    )


def mdadm_conf_command(array: str) -> str:
    """Put the array's ARRAY line (`mdadm --detail --brief`) into mdadm.conf in place of any
    line for the same device, then rebuild the initramfs, which assembles arrays at boot from
    its copy of mdadm.conf (Debian's mdadm README.initramfs)."""
    quoted = shlex.quote(array)
    return (
        f"mkdir -p /etc/mdadm && line=$(mdadm --detail --brief {quoted}) && "
        f'test -n "$line" && {{ grep -v -e "^ARRAY {array} " {MDADM_CONF} 2>/dev/null; '
        f'echo "$line"; }} > {MDADM_CONF}.gpuinfra && mv {MDADM_CONF}.gpuinfra {MDADM_CONF} && '
        "if command -v update-initramfs >/dev/null; then update-initramfs -u; fi"
    )


def _array_state(volume: Volume, facts: Facts, judged: Judgement) -> tuple[bool, bool]:
    """The array part of a RAID 0 volume: returns (whether it is created in this run, hence
    blank, whether the array can be used at all)."""
    array = volume.array
    assert array is not None
    probes = {disk: facts(DiskProbe, device=disk) for disk in volume.disks}
    missing = [disk for disk, found in probes.items() if found is None]
    current = facts(ArrayDetail, array=array)
    # /proc/mdstat as the kernel (and node exporter's alert) sees it: a member marked (F), or an
    # array that stands inactive (found at boot with a member missing), under its kernel name.
    kernel_names = {found["path"].rsplit("/", 1)[-1] for found in probes.values() if found}
    stat = facts(MdStat) or {}
    if current is not None:
        device, detail = current
        assert isinstance(detail, MdDetail)
        listed = stat.get(device.rsplit("/", 1)[-1])
        if listed is not None and not listed.healthy:
            failed = f", {', '.join(listed.failed)} failed" if listed.failed else ""
            state = "active" if listed.active else "inactive"
            judged.findings.append(f"data_disks: array {array} is {state} in /proc/mdstat{failed}")
        paths = {found["path"]: disk for disk, found in probes.items() if found}
        others = [member for member in detail.members if member not in paths]
        if others:
            judged.refusal = (
                f"array {array} holds {', '.join(others)}, which the inventory does not list "
                f"for volume {volume.name}"
            )
            return False, False
        if detail.level != "raid0" or (detail.chunk_kib not in (None, volume.chunk_kib)):
            judged.refusal = (
                f"array {array} is {detail.level} with chunk {detail.chunk_kib}K, the inventory "
                f"says raid0 with chunk {volume.chunk_kib}K (an array is never recreated)"
            )
            return False, False
        gone = missing + [
            disk for disk, found in probes.items() if found and found["path"] not in detail.members
        ]
        for disk in gone:
            judged.findings.append(f"data_disks: array {array}: member {disk} is gone")
        if not detail.healthy:
            judged.findings.append(
                f"data_disks: array {array} is {detail.state or 'not healthy'} "
                f"({detail.active_devices} of {detail.raid_devices} devices active)"
            )
        conf = facts(MdadmConfArrays) or []
        if not any(f"UUID={detail.uuid}" in line for line in conf):
            judged.commands.append(mdadm_conf_command(array))
        return False, not gone and detail.healthy
    standing = [
        name
        for name, listed in sorted(stat.items())
        if not listed.active and kernel_names & set(listed.members)
    ]
    if standing:
        # Assembling again would fail on members the inactive array holds: a person stops it
        # (mdadm --stop) once the missing disk is back or replaced.
        judged.findings.append(
            f"data_disks: array {array} stands inactive as {', '.join(standing)} in /proc/mdstat"
        )
        return False, False
    if missing:
        judged.findings.append(
            f"data_disks: array {array} is missing and cannot be assembled: "
            f"{', '.join(missing)} gone"
        )
        return False, False
    members = [probes[disk] for disk in volume.disks]
    if all(_ours_member(volume, found) for found in members):
        uuids = {found["probe"].get("UUID") for found in members}
        if len(uuids) != 1:
            judged.refusal = f"the disks of volume {volume.name} belong to different md arrays"
            return False, False
        disks = " ".join(shlex.quote(disk) for disk in volume.disks)
        judged.commands.append(f"mdadm --assemble {array} {disks}")
        judged.commands.append(mdadm_conf_command(array))
        return False, True
    for disk, found in zip(volume.disks, members, strict=True):
        reason = disk_refusal(volume, disk, found)
        if reason is None and found["probe"].get("TYPE"):
            reason = f"{disk} holds a filesystem of its own; members of an array must be blank"
        if reason:
            judged.refusal = reason
            return False, False
    judged.commands.append(create_command(volume, volume.disks))
    judged.commands.append(mdadm_conf_command(array))
    return True, True


def judge(volume: Volume, facts: Facts) -> Judgement:
    """What the volume needs on this host (see the module docstring)."""
    judged = Judgement()
    device = volume.device
    if volume.array:
        created, usable = _array_state(volume, facts, judged)
        if judged.refusal or not usable:
            return judged
        # An array created or assembled in this run has no facts yet.
        found = facts(DiskProbe, device=device) if _array_exists(volume, facts) else None
    else:
        created = False
        found = facts(DiskProbe, device=device)
        if found is None:
            judged.findings.append(f"data_disks: disk {device} of volume {volume.name} is gone")
            return judged
    if found is not None:
        judged.refusal = disk_refusal(volume, device, found)
        if judged.refusal:
            return judged
    dev, mnt = shlex.quote(device), shlex.quote(volume.mountpoint)
    if created or (found is not None and not found["probe"].get("TYPE")):
        mkfs = "mkfs.xfs -q -L" if volume.filesystem == "xfs" else "mkfs.ext4 -q -L"
        judged.commands.append(f"{mkfs} {volume.label} {dev}")
    elif found is None:
        # An array assembled in this run: its filesystem is read only when the command runs,
        # and must be this volume's (it was not known blank, so it is never formatted).
        judged.commands.append(
            f'test "$(blkid -p -s LABEL -o value {dev})" = {volume.label} || '
            f'{{ echo "refusing to mount {device}: no filesystem labelled {volume.label}" >&2; '
            "exit 1; }"
        )
    options = ",".join(volume.options)
    uuid = None if found is None else found["probe"].get("UUID")
    wanted = f"UUID={uuid} {volume.mountpoint} {volume.filesystem} {options} 0 2"
    if uuid is None or facts(FstabEntry, path=volume.mountpoint) != wanted:
        judged.commands.append(fstab_command(device, volume.mountpoint, volume.filesystem, options))
    mounted = facts(MountedAt, path=volume.mountpoint)
    if mounted is None:
        # blkid fills its cache so the fstab UUID resolves without udev; "nofail" makes mount(8)
        # succeed silently on a missing device, hence the check after it.
        judged.commands.append(
            f"mkdir -p {mnt} && blkid {dev} >/dev/null && mount {mnt} && mountpoint -q {mnt}"
        )
        return judged
    if found is None or mounted["source"] != found["path"]:
        judged.refusal = (
            f"{volume.mountpoint} has {mounted['source']} mounted, not {device}: unmount it first"
        )
        return judged
    shown = set(mounted["options"])
    wanted_shown = [option for option in volume.options if option in VISIBLE_OPTIONS]
    if "rw" not in shown or not set(wanted_shown) <= shown:
        judged.commands.append(f"mount -o remount,{','.join(['rw', *wanted_shown])} {mnt}")
    return judged


def _array_exists(volume: Volume, facts: Facts) -> bool:
    return volume.array is not None and facts(ArrayDetail, array=volume.array) is not None


def _host_facts(fact: type, **arguments: Any) -> Any:
    return host.get_fact(fact, **arguments)


@operation()
def volumes_ready(volumes: list[Volume]):
    """Every volume of the host made, formatted only when blank, in fstab by UUID and mounted;
    a refusal stops the host with one line naming the disk and what is on it."""
    if not volumes:
        host.noop("no data volumes on this host")
        return
    for volume in volumes:
        judged = judge(volume, _host_facts)
        if judged.refusal:
            raise OperationError(
                f"refusing volume {volume.name}: {judged.refusal}; never wiped: clear it by hand "
                "or name another disk in data_disks.volumes"
            )
        yield from judged.commands


def findings(volumes: list[Volume]) -> list[str]:
    """The health findings of every volume: degraded or missing arrays, disks gone."""
    return [found for volume in volumes for found in judge(volume, _host_facts).findings]
