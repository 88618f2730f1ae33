"""The lab's package cache: what apt-cacher-ng may fetch, and how the lab's hosts reach it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import aptcache
from lab import inventory as lab_inventory
from lab.inventory import inventory_data
from lab.rootfs import Mirror
from lab.topology import default_topology
from tests.unit.test_lab_topology import lab_state, labs_dir  # noqa: F401 (fixture)

MIRROR = Mirror("http://deb.debian.org/debian", "http://deb.debian.org/debian-security")


def test_the_cache_fetches_only_from_the_machines_mirror() -> None:
    conf = aptcache.config_text(MIRROR)
    assert "ForceManaged: 1" in conf
    remaps = [line for line in conf.splitlines() if line.startswith("Remap-")]
    assert remaps == [
        "Remap-gpuinfra0: deb.debian.org/debian ; http://deb.debian.org/debian",
        "Remap-gpuinfra1: deb.debian.org/debian-security ; http://deb.debian.org/debian-security",
    ]
    # It listens on the loopback only; the lab bridges reach it through their nft tables.
    assert f"BindAddress: 127.0.0.1:{aptcache.PORT}" in conf


def test_without_a_security_mirror_only_the_archive_is_remapped() -> None:
    conf = aptcache.config_text(Mirror("http://mirror.example/debian", None))
    assert [line for line in conf.splitlines() if line.startswith("Remap-")] == [
        "Remap-gpuinfra0: mirror.example/debian ; http://mirror.example/debian"
    ]


@pytest.fixture
def machine_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_inventory.rootfs, "machine_mirror", lambda: MIRROR)
    monkeypatch.setattr(
        "lab.rootfs.resolve_mirror", lambda mirror: [("192.0.2.80", "deb.debian.org")]
    )


@pytest.mark.parametrize("installed", [True, False])
def test_lab_hosts_use_the_cache_when_it_is_installed(
    labs_dir: Path,  # noqa: F811
    machine_mirror: None,
    monkeypatch: pytest.MonkeyPatch,
    installed: bool,
) -> None:
    monkeypatch.setattr(aptcache, "available", lambda: installed)
    state = lab_state(labs_dir, "itest", default_topology())
    base = inventory_data(state)["group_vars"]["all"]["base"]
    if installed:
        assert base["apt_proxy"] == f"http://{state.gateway}:{aptcache.PORT}"
    else:
        assert "apt_proxy" not in base
    # Either way the mirror stays named in /etc/hosts: the cache is only a proxy in front of it.
    assert base["extra_hosts"] == {"deb.debian.org": "192.0.2.80"}


def test_the_cache_can_be_switched_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binary = tmp_path / "apt-cacher-ng"
    binary.write_text("")
    monkeypatch.setattr(aptcache, "BINARY", str(binary))
    monkeypatch.delenv(aptcache.SWITCH, raising=False)
    assert aptcache.available()
    monkeypatch.setenv(aptcache.SWITCH, "off")
    assert not aptcache.available()
    monkeypatch.setattr(aptcache, "BINARY", str(tmp_path / "absent"))
    monkeypatch.delenv(aptcache.SWITCH)
    assert not aptcache.available()


@pytest.mark.parametrize("folder_there", [True, False])
def test_a_running_cache_whose_folder_was_removed_is_started_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, folder_there: bool
) -> None:
    """Stand-in for the daemon (no apt-cacher-ng is started here): a cache running with this
    configuration is kept only while its folder exists; removed under it, the cache answers
    every request with a 500 (seen on this machine), so it is stopped and started again."""
    run_dir, cache_dir = tmp_path / "run", tmp_path / "cache"
    monkeypatch.setattr(aptcache, "RUN_DIR", run_dir)
    monkeypatch.setattr(aptcache, "CACHE_DIR", cache_dir)
    (run_dir / "conf").mkdir(parents=True)
    (run_dir / "conf" / "acng.conf").write_text(aptcache.config_text(MIRROR))
    if folder_there:
        cache_dir.mkdir()
    monkeypatch.setattr(aptcache, "_running_pid", lambda: 4242)
    monkeypatch.setattr(aptcache, "_answers", lambda: True)
    monkeypatch.setattr(aptcache, "_user_exists", lambda name: False)
    stopped, started = [], []
    monkeypatch.setattr(aptcache.processes, "stop", lambda pids, deadline_s: stopped.extend(pids))

    def run(argv, **kwargs):
        started.append(argv)
        return aptcache.subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(aptcache.subprocess, "run", run)
    assert aptcache.ensure_running(MIRROR) == 4242
    assert (stopped, bool(started)) == (([], False) if folder_there else ([4242], True))
    assert cache_dir.is_dir()
