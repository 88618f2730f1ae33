"""What `mdadm --detail` and /proc/mdstat say of an md array, read into plain values.

Pure text parsing, shared by the role's facts, its verify suite and the unit tests, which feed
it recorded outputs (tests/unit/recordings/mdadm/, written from mdadm's documentation: the lab's
kernel has no md driver, so no real array exists there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# mdadm(8) "--detail": the State line joins words such as "clean", "active", "degraded",
# "FAILED", "Not Started"; md(4) adds "broken" (a RAID 0 or linear array that lost a member,
# kernel 5.4+). Any of these means the array does not hold all its data.
UNHEALTHY_STATES = ("degraded", "failed", "broken", "inactive", "not started")
_ROW = re.compile(r"^\s*(\d+|-)\s+(\d+)\s+(\d+)\s+(\d+|-)\s+(.*?)\s*$")
_SIZE_UNITS = {"K": 1, "M": 2**10, "G": 2**20}


@dataclass(frozen=True)
class MdDetail:
    """`mdadm --detail /dev/md/<name>`: the fields the role and verify judge."""

    level: str  # "raid0"
    raid_devices: int
    active_devices: int
    failed_devices: int
    state: str  # "clean", "broken, FAILED", ...
    chunk_kib: int | None
    uuid: str
    array_kib: int | None  # "Array Size", in 1 KiB blocks
    members: tuple[str, ...]  # device paths of the rows that hold a disk, in RaidDevice order
    rows: tuple[str, ...] = field(default=())  # each device row's State ("active sync", "removed")

    @property
    def healthy(self) -> bool:
        lowered = self.state.lower()
        bad_row = any(word in row for row in self.rows for word in ("removed", "faulty"))
        return (
            not any(word in lowered for word in UNHEALTHY_STATES)
            and self.active_devices == self.raid_devices
            and self.failed_devices == 0
            and not bad_row
        )


def parse_detail(text: str) -> MdDetail | None:
    """The detail of one array, or None when the text holds none (mdadm printed nothing)."""
    values: dict[str, str] = {}
    members: list[tuple[int, str]] = []
    rows: list[str] = []
    in_table = False
    for line in text.splitlines():
        if re.match(r"^\s*Number\s+Major\s+Minor\s+RaidDevice\s+State", line):
            in_table = True
            continue
        if in_table:
            row = _ROW.match(line)
            if not row:
                continue
            state_and_device = row.group(5)
            device = state_and_device.split()[-1] if "/dev/" in state_and_device else None
            state = state_and_device.rsplit(" ", 1)[0] if device else state_and_device
            rows.append(state.strip())
            if device:
                slot = row.group(4)
                members.append((int(slot) if slot != "-" else 1 << 30, device))
            continue
        key, sep, value = line.partition(" : ")
        if sep:
            values[key.strip()] = value.strip()
    if "Raid Level" not in values:
        return None
    chunk = re.match(r"^(\d+)([KMG])$", values.get("Chunk Size", ""))
    size = re.match(r"^(\d+)", values.get("Array Size", ""))
    return MdDetail(
        level=values["Raid Level"],
        raid_devices=int(values.get("Raid Devices", "0")),
        active_devices=int(values.get("Active Devices", "0")),
        failed_devices=int(values.get("Failed Devices", "0")),
        state=values.get("State", ""),
        chunk_kib=int(chunk.group(1)) * _SIZE_UNITS[chunk.group(2)] if chunk else None,
        uuid=values.get("UUID", ""),
        array_kib=int(size.group(1)) if size else None,
        members=tuple(device for _, device in sorted(members)),
        rows=tuple(rows),
    )


@dataclass(frozen=True)
class MdStatArray:
    """One array of /proc/mdstat: `md127 : active raid0 nvme4n1[3] nvme1n1[0](F)`."""

    name: str  # md127
    active: bool  # "active" (false: "inactive")
    level: str | None  # raid0; absent on an inactive array
    members: tuple[str, ...]  # kernel names, in slot order
    failed: tuple[str, ...]  # members marked (F)
    chunk_kib: int | None

    @property
    def healthy(self) -> bool:
        return self.active and not self.failed


def parse_mdstat(text: str) -> dict[str, MdStatArray]:
    """Every array /proc/mdstat lists, by kernel name (md(4), "/proc/mdstat")."""
    arrays: dict[str, MdStatArray] = {}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        head = re.match(r"^(md\w+)\s*:\s*(active|inactive)\s*(.*)$", line)
        if not head:
            continue
        words = head.group(3).split()
        level = None
        if words and not re.match(r"^\S+\[\d+\]", words[0]):
            # "active (auto-read-only) raid0 ..." and "active raid0 ...": the level precedes
            # the members; an inactive array lists members only.
            while words and words[0].startswith("("):
                words.pop(0)
            level = words.pop(0) if words and "[" not in words[0] else None
        slots: list[tuple[int, str]] = []
        failed: list[str] = []
        for word in words:
            member = re.match(r"^(\S+)\[(\d+)\](\([A-Z]\))*$", word)
            if member:
                slots.append((int(member.group(2)), member.group(1)))
                if "(F)" in word:
                    failed.append(member.group(1))
        following = lines[index + 1] if index + 1 < len(lines) else ""
        chunk = re.search(r"(\d+)k chunks", following)
        arrays[head.group(1)] = MdStatArray(
            name=head.group(1),
            active=head.group(2) == "active",
            level=level,
            members=tuple(name for _, name in sorted(slots)),
            failed=tuple(failed),
            chunk_kib=int(chunk.group(1)) if chunk else None,
        )
    return arrays
