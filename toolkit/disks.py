"""Facts about block devices and /etc/fstab for every role that holds a disk (etcd, data_disks)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class BlockDevice(FactBase):
    """A block device as `blkid -p` probes it: {} when it holds nothing, None when missing."""

    def command(self, device: str) -> str:
        quoted = shlex.quote(device)
        return f"if test -b {quoted}; then echo PRESENT; blkid -p -o export {quoted} || true; fi"

    def process(self, output: list[str]) -> dict[str, str] | None:
        if not output or output[0].strip() != "PRESENT":
            return None
        return dict(line.split("=", 1) for line in output[1:] if "=" in line)


class FstabEntry(FactBase):
    """The /etc/fstab line that mounts something at a path, or None."""

    def command(self, path: str) -> str:
        return (
            f"awk -v p={shlex.quote(path)} '$1 !~ /^#/ && $2 == p' /etc/fstab 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else None


def fstab_command(device: str, mountpoint: str, filesystem: str, options: str) -> str:
    """Replace the fstab line of `mountpoint` with one that mounts `device`'s filesystem by its
    UUID, read on the host when the command runs (a filesystem made earlier in the same run
    has no UUID in any fact)."""
    dev, mnt = shlex.quote(device), shlex.quote(mountpoint)
    return (
        f'uuid=$(blkid -s UUID -o value {dev}) && test -n "$uuid" && '
        f"awk -v p={mnt} '!($1 !~ /^#/ && $2 == p)' /etc/fstab > /etc/fstab.gpuinfra && "
        f'echo "UUID=$uuid {mountpoint} {filesystem} {options} 0 2" '
        ">> /etc/fstab.gpuinfra && mv /etc/fstab.gpuinfra /etc/fstab"
    )
