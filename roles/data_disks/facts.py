"""Facts the data_disks role reads: each disk as blkid and the kernel see it, md arrays,
mdadm.conf and what is mounted at a volume's mount point."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from roles.data_disks.mdadm import MdDetail, MdStatArray, parse_detail, parse_mdstat

MDADM_CONF = "/etc/mdadm/mdadm.conf"  # Debian's and Ubuntu's place (mdadm.conf(5))


class DiskProbe(FactBase):
    """A disk by its stable name: where the name leads, what `blkid -p` finds on it, which
    devices hold it (an md array) and where it is mounted; None when the name leads nowhere.

    `{"path": "/dev/nvme1n1", "probe": {"TYPE": "xfs", "UUID": "..."}, "holders": ["md127"],
    "mounts": ["/data"]}`
    """

    def command(self, device: str) -> str:
        dev = shlex.quote(device)
        return (
            f'if test -b {dev}; then real=$(readlink -f {dev}); echo "path $real"; '
            'for h in /sys/class/block/"${real##*/}"/holders/*; do '
            '[ -e "$h" ] && echo "holder ${h##*/}"; done; '
            'findmnt -rn -o TARGET -S "$real" | sed "s/^/mount /"; '
            f'blkid -p -o export {dev} | sed "s/^/blkid /"; fi; true'
        )

    def process(self, output: list[str]) -> dict | None:
        found: dict = {"path": None, "probe": {}, "holders": [], "mounts": []}
        for line in output:
            kind, _, value = line.strip().partition(" ")
            if kind == "path":
                found["path"] = value
            elif kind == "holder":
                found["holders"].append(value)
            elif kind == "mount":
                # findmnt -r writes a space in a path as \x20
                found["mounts"].append(value.replace("\\x20", " "))
            elif kind == "blkid" and "=" in value:
                key, _, text = value.partition("=")
                found["probe"][key] = text
        return found if found["path"] else None


class ArrayDetail(FactBase):
    """`mdadm --detail` of an array by its /dev/md/<name> link, read by mdadm.parse_detail,
    with the kernel device the link leads to; None when there is no such array."""

    def command(self, array: str) -> str:
        quoted = shlex.quote(array)
        return (
            f"if test -b {quoted} && command -v mdadm >/dev/null; then "
            f'echo "device $(readlink -f {quoted})"; mdadm --detail {quoted} 2>/dev/null; fi; true'
        )

    def process(self, output: list[str]) -> tuple[str, MdDetail] | None:
        if not output or not output[0].startswith("device "):
            return None
        detail = parse_detail("\n".join(output[1:]))
        return (output[0].split(" ", 1)[1].strip(), detail) if detail else None


class MdStat(FactBase):
    """/proc/mdstat read by mdadm.parse_mdstat: `{"md127": MdStatArray(...)}`; empty without
    md (the lab's kernel) or without arrays."""

    @staticmethod
    def default() -> dict:
        return {}

    def command(self) -> str:
        return "cat /proc/mdstat 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, MdStatArray]:
        return parse_mdstat("\n".join(output))


class MdadmConfArrays(FactBase):
    """The ARRAY lines of mdadm.conf, which mdadm and the initramfs assemble at boot from."""

    @staticmethod
    def default() -> list:
        return []

    def command(self) -> str:
        return f"grep -E '^ARRAY[[:space:]]' {MDADM_CONF} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [" ".join(line.split()) for line in output if line.strip()]


class MountedAt(FactBase):
    """What is mounted at a path: `{"source": "/dev/vdb", "options": ["rw", "noatime"]}` with
    the source's links resolved (pyinfra's Mounts gives the source as the mount named it, and a
    volume mounted by UUID may be named by a link or by its kernel name); None when nothing is."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (
            f"findmnt -rn -o SOURCE,OPTIONS --mountpoint {quoted} | tail -n 1 | "
            'while read -r source options; do echo "$(readlink -f "$source") $options"; done; true'
        )

    def process(self, output: list[str]) -> dict | None:
        lines = [line.split() for line in output if line.strip()]
        if not lines or len(lines[-1]) < 2:
            return None
        source, options = lines[-1][0], lines[-1][1]
        return {"source": source, "options": options.split(",")}
