"""Which hosts a lab boots: the default 16-host cluster, a 100-host scale cluster, or N hosts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from lab.errors import LabInvalid

# Hosts booting at once: enough to keep 2 cores busy, few enough that none starves past its
# timeout (LAB.md: 60 hosts booted in 55 s).
DEFAULT_PARALLEL = 24

# Lab hosts have no GPU; a gpu_worker still needs a spec to validate, so it names a real part.
LAB_GPU_MODEL = "H100-SXM5-80GB"
LAB_GPU_COUNT = 8
# Inside each host the attached loop device appears under this name (a second virtio disk).
DISK_DEVICE = "/dev/vdb"
# A host's further disks follow as /dev/vdc, /dev/vdd ...; each also gets a stable name under
# /dev/disk/by-id/ (made at boot by lab/host.py's stand-in for udev) for the data_disks role.
DISK_ID_PREFIX = "/dev/disk/by-id/virtio-gpuinfra-"
# The default lab's data disk on gpu-1: above mkfs.xfs's 300 MB floor; a sparse file.
DATA_DISK_BYTES = 512 * 2**20
# A storage host's OSD disk: Ceph's quota test writes 1 GiB three times over (size 3); a sparse
# file, so only what the OSDs write takes room on the machine's disk.
OSD_DISK_BYTES = 4 * 2**30
TOPOLOGIES = ("default", "scale")
# Kubernetes nodes: containerd and kubelet run containers inside these hosts (lab/host.py).
CONTAINER_GROUPS = frozenset({"control_plane", "gpu_worker", "cpu_worker"})
_SIZE = re.compile(r"^(\d+)([KMGT]?)(i?B)?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class HostSpec:
    name: str
    groups: tuple[str, ...]
    gpu: bool = False  # a gpu_worker: the inventory gets a gpu spec (see LAB_GPU_MODEL)
    disk_bytes: int | None = None  # a loop-file block device, seen inside as DISK_DEVICE
    extra_disks: tuple[int, ...] = ()  # more loop-file disks after it: /dev/vdc, /dev/vdd ...

    @property
    def disk_sizes(self) -> tuple[int, ...]:
        """Every disk of the host in device order (vdb first); none without disk_bytes."""
        return (self.disk_bytes, *self.extra_disks) if self.disk_bytes else ()

    @property
    def runs_containers(self) -> bool:
        return bool(CONTAINER_GROUPS.intersection(self.groups))

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "groups": list(self.groups),
            "gpu": self.gpu,
            "disk_bytes": self.disk_bytes,
            "extra_disks": list(self.extra_disks),
        }

    @classmethod
    def from_json(cls, data: dict) -> HostSpec:
        # A lab recorded before hosts had several disks has no extra_disks.
        extra = tuple(data.get("extra_disks", ()))
        return cls(data["name"], tuple(data["groups"]), data["gpu"], data["disk_bytes"], extra)


@dataclass(frozen=True)
class Topology:
    """The hosts of a lab in address order, whether the API needs a virtual address, and
    whether its etcd members run this machine's etcd build where the lab runs no Kubernetes."""

    hosts: tuple[HostSpec, ...]
    kind: str = "default"
    needs_vip: bool = field(default=False)
    # The etcd line a lab without Kubernetes installs: Debian's package (3.5) by default, the
    # sample's (the build, 3.6) when set; a lab with Kubernetes always runs the build.
    etcd_build: bool = False

    def names(self) -> list[str]:
        return [host.name for host in self.hosts]

    def with_disks(self, disks: dict[str, int]) -> Topology:
        unknown = sorted(set(disks) - set(self.names()))
        if unknown:
            raise LabInvalid(f"--disk names hosts not in the lab: {', '.join(unknown)}")
        hosts = tuple(
            replace(host, disk_bytes=disks.get(host.name, host.disk_bytes)) for host in self.hosts
        )
        return replace(self, hosts=hosts)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "needs_vip": self.needs_vip,
            "etcd_build": self.etcd_build,
            "hosts": [host.to_json() for host in self.hosts],
        }

    @classmethod
    def from_json(cls, data: dict) -> Topology:
        hosts = tuple(HostSpec.from_json(host) for host in data["hosts"])
        # A lab recorded before the etcd line was a choice ran Debian's.
        return cls(hosts, data["kind"], data["needs_vip"], data.get("etcd_build", False))


def default_topology() -> Topology:
    """The reference design in miniature: every group present, etcd at its full five members."""
    hosts = [HostSpec(f"etcd-{i}", ("etcd",)) for i in range(1, 6)]
    # Three API servers: one can be down (or upgraded) while two keep the cluster serving.
    hosts += [HostSpec(f"cp-{i}", ("control_plane",)) for i in range(1, 4)]
    hosts += [
        HostSpec("lb-1", ("loadbalancer",)),
        HostSpec("dns-1", ("dns",)),
        # mon-1 doubles as the DNS secondary: issue 5 needs a primary and a secondary, and one more
        # host would cost memory and CPU the machine shares.
        HostSpec("mon-1", ("monitoring", "dns")),
        HostSpec("cpu-1", ("cpu_worker",)),
        # gpu-1's data disk: the data_disks role formats and mounts it (one disk: the lab's
        # kernel has no md driver for the reference server's RAID 0).
        HostSpec("gpu-1", ("gpu_worker",), gpu=True, disk_bytes=DATA_DISK_BYTES),
    ]
    # The shared file system (CephFS) on three hosts of its own, as on the reference cluster:
    # three monitors keep a quorum and three OSDs keep size 3 writable with one host down.
    hosts += [HostSpec(f"stor-{i}", ("storage",), disk_bytes=OSD_DISK_BYTES) for i in range(1, 4)]
    return Topology(tuple(hosts), "default")


def scale_topology() -> Topology:
    """A 100-host production shape: HA everywhere (two balancers share api.vip) and many workers."""
    hosts = [HostSpec(f"etcd-{i}", ("etcd",)) for i in range(1, 6)]
    hosts += [HostSpec(f"cp-{i}", ("control_plane",)) for i in range(1, 4)]
    hosts += [HostSpec(f"lb-{i}", ("loadbalancer",)) for i in range(1, 3)]
    hosts += [HostSpec(f"dns-{i}", ("dns",)) for i in range(1, 3)]
    hosts += [HostSpec("mon-1", ("monitoring",))]
    hosts += [HostSpec(f"gpu-{i:02d}", ("gpu_worker",), gpu=True) for i in range(1, 25)]
    hosts += [HostSpec(f"cpu-{i:02d}", ("cpu_worker",)) for i in range(1, 64)]
    return Topology(tuple(hosts), "scale", needs_vip=True)


def generic_topology(count: int) -> Topology:
    """count interchangeable CPU workers, for scale measurements of the engine itself."""
    if count < 1:
        raise LabInvalid(f"--hosts must be at least 1 (got {count})")
    width = max(3, len(str(count)))
    hosts = tuple(HostSpec(f"host-{i:0{width}d}", ("cpu_worker",)) for i in range(1, count + 1))
    return Topology(hosts, f"hosts-{count}")


def disk_devices(count: int) -> list[str]:
    """The device names of a host's disks inside it: /dev/vdb, /dev/vdc ..."""
    if count > 24:
        raise LabInvalid(f"a lab host has at most 24 disks (asked for {count})")
    return [f"/dev/vd{chr(ord('b') + index)}" for index in range(count)]


def disk_id(device: str) -> str:
    """The stable name a lab disk gets at boot: /dev/vdc -> /dev/disk/by-id/virtio-gpuinfra-vdc."""
    return DISK_ID_PREFIX + device.rsplit("/", 1)[-1]


def named_topology(kind: str) -> Topology:
    if kind == "default":
        return default_topology()
    if kind == "scale":
        return scale_topology()
    raise LabInvalid(f"unknown topology {kind!r} (known: {', '.join(TOPOLOGIES)})")


def parse_size(text: str) -> int:
    """Bytes from a size such as 512M, 2G or 1GiB (powers of 1024, as losetup and truncate)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise LabInvalid(f"invalid size {text!r}: use a number with K, M, G or T (e.g. 2G)")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size < 2**20:
        raise LabInvalid(f"disk size {text!r} is below 1M: too small for a filesystem")
    return size


def parse_disks(options: list[str]) -> dict[str, int]:
    """{host: bytes} from repeated --disk HOST=SIZE options."""
    disks: dict[str, int] = {}
    for option in options:
        host, sep, size = option.partition("=")
        if not sep or not host:
            raise LabInvalid(f"invalid --disk {option!r}: use HOST=SIZE, e.g. etcd-1=2G")
        disks[host] = parse_size(size)
    return disks
