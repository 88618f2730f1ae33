"""How a lab host is booted and supervised, and where its packages come from (no root needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from lab import host, lifecycle, system
from lab.errors import LabError
from lab.host import HostPaths
from lab.naming import LabNames
from lab.rootfs import Mirror, machine_mirror

DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(DEB822)
    mirror = machine_mirror((tmp_path / "sources.list", tmp_path))
    assert mirror == Mirror("http://mirror.example/debian", "http://mirror.example/debian-security")
    assert mirror.hostnames == ["mirror.example"]


def test_mirror_from_one_line_sources(tmp_path: Path) -> None:
    listing = tmp_path / "sources.list"
    listing.write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [arch=amd64] http://ftp.example/debian/ bookworm main\n"
    )
    assert machine_mirror((listing,)) == Mirror("http://ftp.example/debian", None)


def test_no_mirror_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "other.list").write_text("deb https://packages.example/apt stable main\n")
    with pytest.raises(LabError, match="no Debian archive"):
        machine_mirror((tmp_path,))


def test_hosts_get_non_free_and_security() -> None:
    sources = lifecycle._apt_sources(Mirror("http://m.example/debian", "http://m.example/ds"))
    assert "Suites: trixie trixie-updates" in sources
    assert "Suites: trixie-security" in sources
    assert sources.count("Components: main contrib non-free non-free-firmware") == 2


def test_nspawn_argv_has_what_lab_md_measured(tmp_path: Path) -> None:
    paths = HostPaths(tmp_path / "etcd-1")
    argv = host.nspawn_argv(paths, "etcd-1", "gpuinfra.lab.etcd-1", [])
    assert argv[0] == "systemd-nspawn"
    for flag in (
        "--boot",
        "--register=no",
        "--keep-unit",
        "--capability=CAP_NET_ADMIN",
        "--network-namespace-path=/run/netns/gpuinfra.lab.etcd-1",
        f"--directory={paths.merged}",
    ):
        assert flag in argv
    with_disk = host.nspawn_argv(paths, "etcd-1", "ns", ["/dev/loop7"])
    assert "--capability=CAP_NET_ADMIN,CAP_SYS_ADMIN" in with_disk
    assert "--bind=/dev/loop7:/dev/vdb" in with_disk
    several = host.nspawn_argv(paths, "cpu-1", "ns", ["/dev/loop7", "/dev/loop9"])
    assert "--bind=/dev/loop9:/dev/vdc" in several and "--bind=/dev/loop7:/dev/vdb" in several


def test_disks_get_stable_names_at_boot_from_the_udev_stand_in(tmp_path: Path) -> None:
    paths = HostPaths(tmp_path / "cpu-1")
    host.write_disk_ids(paths)
    script = (paths.merged / host.DISK_IDS_SCRIPT).read_text()
    assert "[ -b /dev/vdc ] && ln -sfn ../../vdc /dev/disk/by-id/virtio-gpuinfra-vdc" in script
    # The fstab mounts come after the names, which fstab's UUIDs do not need but a by-id does.
    mount = script.index("mount -a -t xfs,ext4 -O no_netdev")
    assert script.index("ln -sfn ../../vdx") < script.index("blkid >/dev/null") < mount
    unit = (paths.merged / host.DISK_IDS_UNIT).read_text()
    assert "Before=local-fs-pre.target" in unit
    wants = paths.merged / "etc/systemd/system/sysinit.target.wants/gpuinfra-lab-disk-ids.service"
    assert wants.is_symlink()
    assert [host.disk_image_name(i) for i in range(3)] == [
        "disk.img",
        "disk-vdc.img",
        "disk-vdd.img",
    ]


def run_supervisor(tmp_path: Path, fake_nspawn: str) -> tuple[int, str]:
    """Run the supervisor loop in the foreground with a stand-in for systemd-nspawn."""
    paths = HostPaths(tmp_path)
    script = tmp_path / host.SUPERVISOR_SCRIPT
    script.write_text(host.supervisor_script(paths, "h", "lab", ["sh", "-c", fake_nspawn]))
    subprocess.run(["sh", str(script)], check=True, timeout=30)
    boots = int((tmp_path / "boots").read_text())
    return boots, (tmp_path / host.EXIT_STATUS).read_text().strip()


def test_supervisor_boots_again_after_reboot_and_not_after_poweroff(tmp_path: Path) -> None:
    # Reboots twice (exit 133), then powers off (exit 0): three boots in all.
    fake = 'n=$(cat boots 2>/dev/null || echo 0); echo $((n+1)) > boots; [ "$n" -lt 2 ] && exit 133; exit 0'  # noqa: E501
    assert run_supervisor(tmp_path, fake) == (3, "0")


def test_supervisor_does_not_boot_again_once_stop_was_requested(tmp_path: Path) -> None:
    fake = f"echo 1 > boots; touch {host.STOP_REQUESTED}; exit 133"
    assert run_supervisor(tmp_path, fake) == (1, "133")


def test_supervisor_stops_on_a_crash(tmp_path: Path) -> None:
    assert run_supervisor(tmp_path, "echo 1 > boots; exit 1") == (1, "1")


def test_supervisor_script_names_its_lab_folder(tmp_path: Path) -> None:
    # `lab down` finds supervisors by the lab folder in their command line.
    names = LabNames("lab", 0)
    paths = HostPaths(names.host_dir("etcd-1"))
    script = host.supervisor_script(paths, "etcd-1", "lab", ["systemd-nspawn"])
    assert str(paths.root) in script


runner = CliRunner()


def test_not_root_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    result = runner.invoke(app, ["lab", "up", "--name", "unit"])
    assert result.exit_code == 2
    assert "needs root" in result.output
    assert "Traceback" not in result.output


def test_missing_tools_name_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system.shutil, "which", lambda tool: None)
    result = runner.invoke(app, ["lab", "up", "--name", "unit"])
    assert result.exit_code == 2
    assert "debootstrap" in result.output and "systemd-container" in result.output


def test_hosts_and_topology_together_are_refused() -> None:
    result = runner.invoke(app, ["lab", "up", "--hosts", "3", "--topology", "default"])
    assert result.exit_code == 2
    assert "either --hosts or --topology" in result.output


def test_reserved_name_is_refused() -> None:
    result = runner.invoke(app, ["lab", "down", "--name", "sample"])
    assert result.exit_code == 2
    assert "reserved" in result.output


def test_a_layer_must_be_a_folder_whose_path_fits_overlay_options(tmp_path: Path) -> None:
    from lab.errors import LabInvalid

    with pytest.raises(LabInvalid, match="no such folder"):
        lifecycle._resolve_state("layers", None, None, tmp_path / "missing")
    separated = tmp_path / "a:b"
    separated.mkdir()
    with pytest.raises(LabInvalid, match="must not hold"):
        lifecycle._resolve_state("layers", None, None, separated)


def test_overlay_lays_the_layer_between_debian_and_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts: list[list[str]] = []
    monkeypatch.setattr(host, "run", lambda argv, **_: mounts.append(argv))
    monkeypatch.setattr(host, "mounted_paths", lambda: set())
    paths = HostPaths(tmp_path / "h")
    host.ensure_root_mounted(paths, Path("/debian"), Path("/layer"))
    options = mounts[0][mounts[0].index("-o") + 1]
    assert options.startswith("lowerdir=/layer:/debian,upperdir=")


def test_every_host_gets_dev_fuse_for_ceph_fuse(tmp_path: Path) -> None:
    paths = HostPaths(tmp_path / "cpu-1")
    for runs_containers in (False, True):
        argv = host.nspawn_argv(paths, "cpu-1", "ns", [], runs_containers=runs_containers)
        assert "--bind=/dev/fuse" in argv
