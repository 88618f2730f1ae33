"""Each storage host: its monitor, manager, MDS and OSD run and start at boot, the cluster is
HEALTH_OK with every monitor in quorum and every OSD up, and the pools keep their copies."""

from __future__ import annotations

import json

import pytest

from roles.shared_fs.config import SharedFsConfig
from roles.shared_fs.files import osd_id, storage_hosts

TARGET_GROUPS = ("storage",)


def ceph_json(host, command: str):
    return json.loads(host.check_output(f"timeout 30 ceph {command} -f json"))


@pytest.mark.parametrize("daemon", ["mon", "mgr", "mds", "osd"])
def test_daemon_runs_and_starts_at_boot(host, ctx, daemon: str) -> None:
    ident = osd_id(ctx) if daemon == "osd" else ctx.name
    service = host.service(f"ceph-{daemon}@{ident}")
    assert service.is_running
    assert service.is_enabled


def test_the_crash_poster_is_off(host) -> None:
    """ceph-crash stays stopped: the mgr's crash module does not load on Debian 13's reef."""
    service = host.service("ceph-crash")
    assert not service.is_running
    assert not service.is_enabled


def test_cluster_is_healthy(host) -> None:
    assert ceph_json(host, "health")["status"] == "HEALTH_OK"


def test_every_storage_host_is_in_quorum(host, ctx) -> None:
    assert sorted(ceph_json(host, "quorum_status")["quorum_names"]) == sorted(storage_hosts(ctx))


def test_every_osd_is_up_and_in(host, ctx) -> None:
    osds = ceph_json(host, "osd dump")["osds"]
    assert {(o["osd"], o["up"], o["in"]) for o in osds} == {
        (i, 1, 1) for i in range(len(storage_hosts(ctx)))
    }


@pytest.mark.parametrize("pool", ["metadata", "data"])
def test_pool_keeps_its_copies(host, ctx, pool: str) -> None:
    cfg = ctx.config(SharedFsConfig)
    name = f"{cfg.fs_name}_{pool}"
    pools = {p["pool_name"]: p for p in ceph_json(host, "osd pool ls detail")}
    assert (pools[name]["size"], pools[name]["min_size"]) == (cfg.replicas, cfg.min_replicas)
