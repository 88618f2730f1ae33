"""Facts the etcd role reads from a host: its data disk, mounts, fstab and installed version."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

# The disk facts are shared with the data_disks role (a role never imports another).
from toolkit.disks import BlockDevice, FstabEntry

__all__ = ["BlockDevice", "FstabEntry", "EtcdInstalled", "MemberData", "Machine", "Members"]


class EtcdInstalled(FactBase):
    """The version of the etcd binaries a release tarball installed, when etcd, etcdctl and
    etcdutl are all there at the same version (the backup, the health checks and every day-2
    command need the two tools); else nothing. The distribution's packages are read from dpkg's
    list: roles/etcd/operations.py etcd_installed."""

    def command(self, binary_dir: str) -> str:
        return " ".join(
            [
                f"v=$({binary_dir}/etcd --version 2>/dev/null | sed -n 's/^etcd Version: //p');",
                *(
                    f'[ "$({binary_dir}/{tool} version 2>/dev/null | '
                    f'sed -n \'s/^{tool} version: //p\')" = "$v" ] &&'
                    for tool in ("etcdctl", "etcdutl")
                ),
                'echo "$v" || true',
            ]
        )

    def process(self, output: list[str]) -> str | None:
        value = "".join(output).strip()
        return value or None


class MemberData(FactBase):
    """Whether the data directory already holds a member (etcd was set up here before)."""

    def command(self, data_dir: str) -> str:
        return f"test -d {shlex.quote(data_dir)}/member && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


class Machine(FactBase):
    def command(self) -> str:
        return "uname -m"

    def process(self, output: list[str]) -> str:
        return output[0].strip()


class Members(FactBase):
    """The cluster's members as etcd lists them, asked as the operator through every client
    endpoint: `[("etcd-1", "https://10.0.0.1:2380", False)]` as (name, peer URL, learner); a
    member added but not started has no name yet. Nothing while etcd does not answer (before
    the first start): the role then has nothing to judge."""

    def command(self, env_file: str) -> str:
        return (
            f"[ -r {env_file} ] && ( set -a; . {env_file}; set +a; "
            'etcdctl --endpoints="$GPUINFRA_ETCD_ENDPOINTS" --command-timeout=5s member list '
            "2>/dev/null | cut -d, -f3,4,6 ) || true"
        )

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[tuple[str, str, bool]]:
        members = []
        for line in output:
            fields = [field.strip() for field in line.split(",")]
            if len(fields) == 3:
                members.append((fields[0], fields[1], fields[2] == "true"))
        return members
