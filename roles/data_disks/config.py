"""Defaults of the data_disks role; group_vars/host vars under `data_disks:` override them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inventory.grammar import PlainPath, Word

# Kernel names change with probe order (sdb today is sdc after a disk is added or a controller
# probes late): a data disk is named by what udev derives from the hardware itself.
STABLE_PREFIXES = ("/dev/disk/by-id/", "/dev/disk/by-path/")
_KERNEL_NAME = re.compile(r"^/dev/(sd[a-z]+|vd[a-z]+|xvd[a-z]+|hd[a-z]+|nvme\d+n\d+)(p?\d+)?$")


class Volume(BaseModel):
    """One mounted data volume: a single disk, or several striped into an md RAID 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Names the md array (/dev/md/<name>) and the filesystem label (gpi-<name>): xfs allows
    # labels of 12 characters at most, so 8 are left for the name.
    name: str = Field(pattern=r"^[a-z0-9]{1,8}$")
    # RAID 0: four NVMe striped give a training job four disks' bandwidth for datasets and
    # checkpoints (the reference server's layout); losing one loses the volume, which holds
    # copies only. single: one disk, no md.
    layout: Literal["raid0", "single"] = "raid0"
    # Stable names only (/dev/disk/by-id/... or by-path/...), never /dev/sdX or /dev/nvmeXnY.
    disks: list[PlainPath] = Field(min_length=1)
    # xfs: what large sequential reads and parallel checkpoint writes are tuned for, and it
    # takes the md stripe geometry (sunit/swidth) from the array by itself.
    filesystem: Literal["xfs", "ext4"] = "xfs"
    mountpoint: PlainPath = "/data"
    # noatime: no metadata write per read of a dataset file; nofail: a lost array never
    # blocks boot (the node comes up, health checks and drift report the missing volume).
    options: list[Word] = Field(default_factory=lambda: ["noatime", "nofail"])
    # 512 KiB: mdadm's own default chunk since 3.1, large enough for sequential dataset reads.
    chunk_kib: int = Field(512, ge=4, le=65536)

    @field_validator("disks")
    @classmethod
    def _stable_names(cls, disks: list[str]) -> list[str]:
        for disk in disks:
            if _KERNEL_NAME.match(disk) or not disk.startswith(STABLE_PREFIXES):
                raise ValueError(
                    f"{disk} is not a stable name: use /dev/disk/by-id/... or /dev/disk/by-path/"
                    "... (kernel names like /dev/sdb change with probe order)"
                )
        if len(set(disks)) != len(disks):
            raise ValueError("a disk is listed twice")
        return disks

    @field_validator("mountpoint")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or path.rstrip("/") == "" or " " in path:
            raise ValueError(f"{path!r}: an absolute path other than /, without spaces")
        return path.rstrip("/")

    @field_validator("options")
    @classmethod
    def _boot_never_blocks(cls, options: list[str]) -> list[str]:
        if "nofail" not in options:
            raise ValueError("options must hold nofail: a lost disk must never block boot")
        if any(not option or "," in option or " " in option for option in options):
            raise ValueError("one mount option per item, without commas or spaces")
        return options

    @model_validator(mode="after")
    def _layout_fits(self) -> Volume:
        if self.layout == "single" and len(self.disks) != 1:
            raise ValueError(f"layout single takes one disk (got {len(self.disks)})")
        if self.layout == "raid0" and len(self.disks) < 2:
            raise ValueError("layout raid0 needs two disks or more")
        if self.chunk_kib & (self.chunk_kib - 1):
            raise ValueError("chunk_kib must be a power of two (mdadm)")
        return self

    @property
    def array(self) -> str | None:
        """The md device of a RAID 0 volume (mdadm makes /dev/md/<name> a link to /dev/mdN)."""
        return f"/dev/md/{self.name}" if self.layout == "raid0" else None

    @property
    def device(self) -> str:
        """What holds the filesystem: the array, or the one disk."""
        return self.array or self.disks[0]

    @property
    def label(self) -> str:
        return f"gpi-{self.name}"


class DataDisksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # None by default: a disk is only ever formatted when the inventory names it.
    volumes: list[Volume] = Field(default_factory=list)

    @model_validator(mode="after")
    def _no_shared_disks(self) -> DataDisksConfig:
        seen: dict[str, str] = {}
        for volume in self.volumes:
            for key, what in ((f"name {volume.name}", "name"), (volume.mountpoint, "mount")):
                if key in seen:
                    raise ValueError(f"two volumes share the {what} {key.split()[-1]}")
                seen[key] = volume.name
            for disk in volume.disks:
                if disk in seen:
                    raise ValueError(f"{disk} is in volumes {seen[disk]} and {volume.name}")
                seen[disk] = volume.name
        return self
