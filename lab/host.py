"""One lab host on the machine: its copy-on-write root, identity, block device and supervisor."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shlex
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from lab import processes
from lab.naming import LabNames
from lab.system import run
from lab.topology import disk_devices, disk_id

NSPAWN_EXIT_REBOOT = 133  # systemd-nspawn's exit code when the host ran `systemctl reboot`
SUPERVISOR_SCRIPT = "supervise.sh"
CONSOLE_LOG = "console.log"
NSPAWN_PID = "nspawn.pid"
EXIT_STATUS = "exit-status"
STOP_REQUESTED = "stop-requested"
PREPARED = "prepared"
DISK_FILE = "disk.img"
HOST_KEY = "etc/ssh/ssh_host_ed25519_key"
SSHD_DROP_IN = """\
# gpuinfra lab: one host key per host, made on the machine before first boot (its public
# half is in the lab's known_hosts), and keys only: the lab key is authorised for root.
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
PermitRootLogin prohibit-password
"""
RESOLV_CONF = """\
# gpuinfra lab: no name server; /etc/hosts names the Debian mirror, and lab traffic must not
# leave the lab bridge for anything else.
options timeout:1 attempts:1
"""


@dataclass(frozen=True)
class HostPaths:
    """Where one host's files live in the lab's state folder."""

    root: Path

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def merged(self) -> Path:
        return self.root / "merged"

    def __truediv__(self, name: str) -> Path:
        return self.root / name


def mounted_paths() -> set[str]:
    """Mount points of the machine's own mount namespace."""
    with open("/proc/self/mountinfo") as mountinfo:
        return {line.split()[4] for line in mountinfo}


def ensure_root_mounted(paths: HostPaths, lower: Path, layer: Path | None = None) -> None:
    """The host's root: the shared Debian root below, a saved layer (if any) on it, the host's
    own changes in upper."""
    for folder in (paths.upper, paths.work, paths.merged):
        folder.mkdir(parents=True, exist_ok=True)
    if str(paths.merged) in mounted_paths():
        return
    lowers = f"{layer}:{lower}" if layer else str(lower)
    options = f"lowerdir={lowers},upperdir={paths.upper},workdir={paths.work}"
    run(["mount", "-t", "overlay", "overlay", "-o", options, str(paths.merged)])


def write_identity(
    paths: HostPaths,
    host: str,
    domain: str,
    address: ipaddress.IPv4Address,
    mirror_hosts: list[tuple[str, str]],
    sources: str,
    lab_public_key: str,
) -> None:
    """Files that make the host itself; written once, so a host keeps its changes across boots."""
    if (paths / PREPARED).exists():
        return
    root = paths.merged
    (root / "etc/hostname").write_text(f"{host}\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines.append(f"{address}\t{host}.{domain} {host}")
    lines += [f"{ip}\t{name}" for ip, name in mirror_hosts]
    (root / "etc/hosts").write_text("\n".join(lines) + "\n")
    (root / "etc/resolv.conf").unlink(missing_ok=True)  # may be a link to the machine's
    (root / "etc/resolv.conf").write_text(RESOLV_CONF)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(sources)
    (root / "etc/ssh/sshd_config.d/gpuinfra-lab.conf").write_text(SSHD_DROP_IN)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(lab_public_key.strip() + "\n")
    authorized.chmod(0o600)
    key = root / HOST_KEY
    if not key.exists():
        # Made here, not by the host, so its public half is known before the first connection.
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", str(key)])
    (paths / PREPARED).write_text("")


# What a host that runs containers needs at every boot, before containerd and kubelet start:
# - systemd-nspawn mounts the cgroup v1 controllers read-only; containerd and kubelet make
#   cgroups in them. The host's cgroup namespace starts at its own folder on the machine
#   (OWN_CGROUPS), so a fresh mount of each controller shows that subtree, writable, and
#   nothing of the other hosts.
# - kubelet reads the kernel log from /dev/kmsg, which nspawn does not provide: the console
#   stands in for it (kind's nodes do the same).
CONTAINERS_SCRIPT = "usr/local/sbin/gpuinfra-lab-containers"
CONTAINERS_SCRIPT_TEXT = """\
#!/bin/sh
# gpuinfra lab: what containerd and kubelet need in a lab host (see gpuinfra's lab/host.py).
set -eu
for dir in /sys/fs/cgroup/*; do
    name=${dir##*/}
    case $name in systemd|unified) continue ;; esac
    [ -L "$dir" ] && continue
    options=$(awk -v d="$dir" '$2 == d && $3 == "cgroup" {print $4}' /proc/self/mounts)
    case ",$options," in *,ro,*) ;; *) continue ;; esac
    umount "$dir"
    mount -t cgroup -o "rw,nosuid,nodev,noexec,$name" cgroup "$dir"
done
[ -e /dev/kmsg ] || ln -s /dev/console /dev/kmsg
"""
CONTAINERS_UNIT = "etc/systemd/system/gpuinfra-lab-containers.service"
CONTAINERS_UNIT_TEXT = f"""\
[Unit]
Description=gpuinfra lab: writable cgroup controllers and /dev/kmsg for containerd and kubelet
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/{CONTAINERS_SCRIPT}

[Install]
WantedBy=sysinit.target
"""
# containerd's overlay snapshotter cannot stack on the host's own overlay root (the kernel
# refuses an overlay upper directory on overlayfs): its state lives on the machine's disk,
# bound into the host (kind gives its nodes a volume for the same reason).
CONTAINERD_STATE = "containerd"
CONTAINERD_DIR = "/var/lib/containerd"


def write_container_support(paths: HostPaths) -> None:
    """What a host that runs containers needs before containerd starts (see CONTAINERS_SCRIPT)."""
    root = paths.merged
    script = root / CONTAINERS_SCRIPT
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(CONTAINERS_SCRIPT_TEXT)
    script.chmod(0o755)
    unit = root / CONTAINERS_UNIT
    unit.write_text(CONTAINERS_UNIT_TEXT)
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit.name
    if not link.is_symlink():
        link.symlink_to(f"/{CONTAINERS_UNIT}")


# Left out of a saved layer: what makes a host itself (every host made from the layer writes its
# own in write_identity; a shared SSH host key or machine id would make the hosts one), and the
# firewall, whose rules name the lab the layer came from: a host booting on them would refuse
# SSH from its own lab's controller. Hosts start with Debian's open ruleset until an apply.
LEFT_OUT = (
    "etc/hostname",
    "etc/machine-id",
    "etc/hosts",
    "etc/resolv.conf",
    "etc/ssh/ssh_host_*",
    "root/.ssh",
    "var/lib/dbus/machine-id",
    "var/lib/systemd/random-seed",
    "var/lib/systemd/credential.secret",
    "var/log/journal",
    "var/cache/apt/archives/*.deb",
    "tmp/*",
    "etc/nftables.conf",
    "etc/nftables.d",
)


def save_layer(paths: HostPaths, out: Path) -> None:
    """Copy a stopped host's own changes (its upper folder, overlay whiteouts and extended
    attributes kept) to `out`, without the files that make it that host."""
    partial = out.with_name(out.name + ".partial")
    run(["rm", "-rf", str(partial)])
    run(["cp", "-a", str(paths.upper), str(partial)])
    for pattern in LEFT_OUT:
        for path in partial.glob(pattern):
            run(["rm", "-rf", str(path)])
    partial.replace(out)


def host_public_key(paths: HostPaths) -> str:
    """The host key as known_hosts wants it: "ssh-ed25519 AAAA..." without the comment."""
    key_type, key_data = (paths.merged / f"{HOST_KEY}.pub").read_text().split()[:2]
    return f"{key_type} {key_data}"


def ensure_disk(paths: HostPaths, size: int, image_name: str = DISK_FILE) -> str:
    """The host's loop device (a sparse file in its folder), attached once; returns /dev/loopN."""
    image = paths / image_name
    if not image.exists():
        with image.open("wb") as handle:
            handle.truncate(size)
    attached = loop_devices_of(image)
    if attached:
        return attached[0]
    return run(["losetup", "--find", "--show", str(image)]).strip()


def disk_image_name(index: int) -> str:
    """The file behind a host's disk: disk.img for /dev/vdb (as before hosts had several),
    disk-vdc.img, disk-vdd.img ... for the others."""
    if index == 0:
        return DISK_FILE
    return f"disk-{disk_devices(index + 1)[index].rsplit('/', 1)[-1]}.img"


def ensure_disks(paths: HostPaths, sizes: tuple[int, ...]) -> list[str]:
    """Every disk of the host attached, in device order (/dev/vdb first)."""
    return [ensure_disk(paths, size, disk_image_name(i)) for i, size in enumerate(sizes)]


# A stand-in for udev and for systemd's fstab generator, neither of which does its part in a lab
# host: at every boot, before the file systems are mounted, each bound disk /dev/vdX gets the
# stable name a real virtio disk has under /dev/disk/by-id/ (lab/topology.py disk_id), so roles
# that refuse kernel names (data_disks) find their disks as on a real server. The serial in the
# name is made up: the lab's own. Then the disks' file systems in /etc/fstab are mounted, as a
# server's systemd mounts them at boot: in a container the generator skips every fstab entry
# naming a device, so a rebooted lab host would come up without its data volume. blkid first
# fills its cache, which is how mount(8) resolves UUID= without udev.
DISK_IDS_SCRIPT = "usr/local/sbin/gpuinfra-lab-disk-ids"
DISK_IDS_UNIT = "etc/systemd/system/gpuinfra-lab-disk-ids.service"


def disk_ids_script() -> str:
    lines = [
        "#!/bin/sh",
        "# gpuinfra lab: stable disk names without udev (see gpuinfra's lab/host.py).",
        f"mkdir -p {disk_id('/dev/vdb').rsplit('/', 1)[0]}",
    ]
    lines += [
        f"[ -b {device} ] && ln -sfn ../../{device.rsplit('/', 1)[-1]} {disk_id(device)}"
        for device in disk_devices(24)
    ]
    lines += [
        "blkid >/dev/null 2>&1",
        "mount -a -t xfs,ext4 -O no_netdev || echo 'gpuinfra lab: an fstab disk did not mount' >&2",
    ]
    return "\n".join([*lines, "exit 0", ""])


DISK_IDS_UNIT_TEXT = f"""\
[Unit]
Description=gpuinfra lab: the disks' by-id names and fstab mounts (no udev in a lab host)
DefaultDependencies=no
Before=local-fs-pre.target
Wants=local-fs-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/{DISK_IDS_SCRIPT}

[Install]
WantedBy=sysinit.target
"""


def write_disk_ids(paths: HostPaths) -> None:
    """Install the udev stand-in (DISK_IDS_SCRIPT) in a host that has disks."""
    root = paths.merged
    script = root / DISK_IDS_SCRIPT
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(disk_ids_script())
    script.chmod(0o755)
    unit = root / DISK_IDS_UNIT
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(DISK_IDS_UNIT_TEXT)
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit.name
    if not link.is_symlink():
        link.symlink_to(f"/{DISK_IDS_UNIT}")


def loop_devices_of(image: Path) -> list[str]:
    output = run(["losetup", "--associated", str(image)], check=False)
    return [line.split(":", 1)[0] for line in output.splitlines() if line.strip()]


def nspawn_argv(
    paths: HostPaths,
    host: str,
    netns: str,
    loop_devices: list[str],
    runs_containers: bool = False,
) -> list[str]:
    """systemd-nspawn as LAB.md measured it: each flag is needed, see there for why.

    A host that runs containers (a Kubernetes node: containerd and runc inside) gets every
    capability (runc makes namespaces, mounts and device nodes, as kind's privileged nodes do)
    and the keyring system calls, which nspawn's filter refuses by default and runc uses for
    each container's session keyring ("unable to join session keyring" without them).

    Every host gets the machine's /dev/fuse: the lab kernel has no kernel CephFS, RBD or NFS
    client, so the shared file system's clients (ceph-fuse) mount through FUSE, and a FUSE
    mount needs the device node (and CAP_SYS_ADMIN to mount, which workers have: every one).
    """
    capabilities = ["CAP_NET_ADMIN"]  # nftables, sysctls and keepalived inside the host
    argv = [
        "systemd-nspawn",
        f"--directory={paths.merged}",
        "--boot",
        f"--machine={host}",
        "--register=no",  # no machine bus on a machine without systemd
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{netns}",
        "--resolv-conf=off",  # the host's own resolv.conf (no name server), see RESOLV_CONF
        "--link-journal=no",
        "--timezone=off",
        "--console=read-only",  # the boot log goes to console.log for post-mortems
        "--bind=/dev/fuse",  # ceph-fuse clients of the shared file system (see above)
    ]
    if loop_devices:
        capabilities.append("CAP_SYS_ADMIN")  # mkfs and mount on the bound devices
    for loop_device, device in zip(loop_devices, disk_devices(len(loop_devices)), strict=True):
        argv.append(f"--bind={loop_device}:{device}")
    if runs_containers:
        capabilities = ["all"]
        argv.append("--system-call-filter=@keyring")
        argv.append(f"--bind={paths / CONTAINERD_STATE}:{CONTAINERD_DIR}")
    argv.insert(1, f"--capability={','.join(capabilities)}")
    return argv


# A host that runs containers gets cgroups of its own in every cgroup v1 hierarchy of the
# machine before systemd-nspawn starts, so its cgroup namespace begins there: its kubelet and
# containerd see their own subtree at /, and two hosts never share (or clean up) each other's
# pod cgroups. cpuset needs its CPUs and memory nodes copied from the parent to admit tasks.
OWN_CGROUPS = """\
while IFS=: read -r _ controllers path; do
    case $controllers in ''|name=*) continue ;; esac
    [ -d "/sys/fs/cgroup/$controllers" ] || continue
    dir="/sys/fs/cgroup/$controllers${{path%/}}/{name}"
    mkdir -p "$dir"
    if [ -e "$dir/cpuset.cpus" ] && [ -z "$(cat "$dir/cpuset.cpus")" ]; then
        cat "${{dir%/*}}/cpuset.cpus" > "$dir/cpuset.cpus"
        cat "${{dir%/*}}/cpuset.mems" > "$dir/cpuset.mems"
    fi
    echo $$ > "$dir/cgroup.procs"
done < /proc/self/cgroup
"""


# Every host gets a folder of its own in the machine's systemd hierarchies (cgroup v2's unified
# one, which systemd-nspawn places itself by on this hybrid machine, and name=systemd) before
# systemd-nspawn starts. nspawn makes its `supervisor` and `payload` folders where it runs and
# hands the host the payload subtree (cgroup v1 has no cgroup namespace), so hosts started from
# one folder shared one payload: each host's systemd created and removed the same unit folders
# (system.slice/etcd-data.service) as the others, and a unit started on several hosts at once
# failed now and then ("Failed to spawn executor: No such file or directory"), another host's
# systemd having removed the folder between this one's mkdir and its spawn.
OWN_SYSTEMD_CGROUP = """\
while IFS=: read -r _ controllers path; do
    case $controllers in
        '') top=/sys/fs/cgroup/unified ;;
        name=systemd) top=/sys/fs/cgroup/systemd ;;
        *) continue ;;
    esac
    [ -d "$top" ] || continue
    dir="$top${{path%/}}/{name}"
    mkdir -p "$dir" && echo $$ > "$dir/cgroup.procs"
done < /proc/self/cgroup
"""


def cgroup_name(lab: str, host: str) -> str:
    """The name of a host's own cgroup folder in the machine's hierarchies (name=systemd for
    every host, every controller's too for a host that runs containers)."""
    return f"gpuinfra-lab-{lab}-{host}"


def remove_own_cgroups(lab: str, host: str) -> None:
    """Remove the host's cgroup folders once nothing runs in them (deepest first)."""
    name = cgroup_name(lab, host)
    for top in Path("/sys/fs/cgroup").glob(f"*/**/{name}"):
        for folder in sorted(top.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            # A process still runs there, or it went already: left for the next down.
            with contextlib.suppress(OSError):
                folder.rmdir()


def supervisor_script(
    paths: HostPaths, host: str, lab: str, argv: list[str], own_cgroups: bool = False
) -> str:
    """A shell loop that boots the host again when it reboots (systemd-nspawn exits 133).

    Powering off (exit 0) or `lab stop` (which leaves STOP_REQUESTED) ends the loop.
    """
    command = " ".join(shlex.quote(word) for word in argv)
    cgroups = OWN_SYSTEMD_CGROUP.format(name=cgroup_name(lab, host))
    if own_cgroups:
        cgroups += OWN_CGROUPS.format(name=cgroup_name(lab, host))
    return f"""\
#!/bin/sh
# gpuinfra lab {lab}, host {host}: keeps the host booted across reboots.
cd {shlex.quote(str(paths.root))} || exit 1
{cgroups}while :; do
    rm -f {EXIT_STATUS}
    SYSTEMD_NSPAWN_API_VFS_WRITABLE=network {command} &
    echo $! > {NSPAWN_PID}
    wait $!
    status=$?
    echo "$status" > {EXIT_STATUS}
    rm -f {NSPAWN_PID}
    [ -e {STOP_REQUESTED} ] && break
    [ "$status" -eq {NSPAWN_EXIT_REBOOT} ] || break
    echo "gpuinfra lab: host rebooted, booting it again" >> {CONSOLE_LOG}
done
"""


def start(
    paths: HostPaths,
    names: LabNames,
    host: str,
    loop_devices: list[str],
    runs_containers: bool = False,
) -> None:
    """Start the host's supervisor, detached from the caller so the lab outlives the command."""
    (paths / STOP_REQUESTED).unlink(missing_ok=True)
    if runs_containers:
        (paths / CONTAINERD_STATE).mkdir(mode=0o711, exist_ok=True)
    if loop_devices:
        write_disk_ids(paths)
    argv = nspawn_argv(paths, host, names.netns(host), loop_devices, runs_containers)
    script = paths / SUPERVISOR_SCRIPT
    script.write_text(supervisor_script(paths, host, names.lab, argv, runs_containers))
    log = paths / CONSOLE_LOG
    # The outer shell exits at once: the supervisor is nobody's child here, so no zombies.
    launcher = 'sh "$0" </dev/null >>"$1" 2>&1 &'
    subprocess.run(
        ["sh", "-c", launcher, str(script), str(log)], check=True, start_new_session=True
    )


def nspawn_pid(paths: HostPaths) -> int | None:
    """The host's running systemd-nspawn, checked against its command line (pids get reused)."""
    try:
        pid = int((paths / NSPAWN_PID).read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if f"--directory={paths.merged}".encode() in cmdline else None


def is_running(paths: HostPaths) -> bool:
    return nspawn_pid(paths) is not None


def request_stop(paths: HostPaths) -> int | None:
    """Ask the host to power off (SIGTERM to systemd-nspawn) and its supervisor not to restart."""
    (paths / STOP_REQUESTED).write_text("")
    pid = nspawn_pid(paths)
    if pid is not None:
        processes.send(pid, signal.SIGTERM)
    return pid


def kill_orphans(paths: HostPaths) -> list[int]:
    """Kill what is left of the host after its systemd-nspawn died (e.g. was SIGKILLed)."""
    orphans = processes.with_root_under(paths.root)
    processes.kill_all(orphans)
    return orphans


def loop_devices_under(folder: Path) -> list[str]:
    """Loop devices whose backing file lies in folder (found even if the file was deleted)."""
    output = run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"], check=False)
    if not output.strip():
        return []
    prefix = str(folder).rstrip("/") + "/"
    return [
        device["name"]
        for device in json.loads(output).get("loopdevices", [])
        if (device.get("back-file") or "").startswith(prefix)
    ]
