"""etcd hardening on lab hosts (issue 13): restore that stages before it swaps and rolls back,
replace that never loses data, certificate renewal on apply, CA rotation with a client
writing throughout, and one member's data disk full.

The lab is its own and small: three etcd members (etcd-3 with a 256 MiB loop disk as its data
disk, so it can be filled) and cp-1, the API server's stand-in holding the etcd client
certificate and running the writer. Its name is `etcdh` (GPUINFRA_ETCDH_LAB_NAME overrides).
Tests that break a member leave the cluster healthy again before they end.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.topology import HostSpec, Topology
from tests.integration.conftest import KEEP_ENV, boot_lab
from tests.integration.roles_helpers import gpuinfra

pytestmark = pytest.mark.integration

LAB = os.environ.get("GPUINFRA_ETCDH_LAB_NAME", "etcdh")
MEMBERS = ["etcd-1", "etcd-2", "etcd-3"]
SMALL_DISK = 256 * 2**20
CLIENT_ENV = (
    "ETCDCTL_CACERT=/etc/kubernetes/pki/etcd/ca.crt "
    "ETCDCTL_CERT=/etc/kubernetes/pki/apiserver-etcd-client.crt "
    "ETCDCTL_KEY=/etc/kubernetes/pki/apiserver-etcd-client.key"
)
RESULTS: dict[str, object] = {}  # measured figures, printed at the end of the module


def topology() -> Topology:
    hosts = (
        HostSpec("etcd-1", ("etcd",)),
        HostSpec("etcd-2", ("etcd",)),
        HostSpec("etcd-3", ("etcd",), disk_bytes=SMALL_DISK),
        HostSpec("cp-1", ("control_plane",)),
    )
    return Topology(hosts, "etcdh")


@pytest.fixture(scope="module")
def lab():
    inventory = Path(f"/tmp/gpuinfra-itest-{LAB}/cluster.yml")
    cluster = boot_lab(LAB, topology(), inventory)
    yield cluster
    print("\netcd hardening figures:", json.dumps(RESULTS, indent=2))
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB)


@pytest.fixture(scope="module")
def converged(lab):
    started = time.monotonic()
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", "base,etcd", "--yes")
    RESULTS["apply_seconds"] = round(time.monotonic() - started, 1)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    lab.ssh("cp-1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-client >/dev/null")
    return lab


def endpoints(lab) -> str:
    return ",".join(f"https://{lab.address(m)}:2379" for m in MEMBERS)


def etcdctl(lab, args: str, *, check: bool = True, timeout: float = 60):
    """etcdctl on cp-1 with the API server's client certificate, against every member."""
    return lab.ssh(
        "cp-1",
        f"{CLIENT_ENV} etcdctl --endpoints={endpoints(lab)} --command-timeout=5s {args}",
        check=check,
        timeout=timeout,
    )


def status(lab) -> tuple[int, dict]:
    result = gpuinfra("etcd", "status", str(lab.inventory_path), "--format", "json")
    return result.returncode, json.loads(result.stdout)


def wait_healthy(lab, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code, data = status(lab)
        if code == ExitCode.OK and data["health"] == "healthy":
            return data
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster not healthy after {timeout}s: {data}")
        time.sleep(3)


def test_cluster_converges(converged):
    data = wait_healthy(converged)
    assert data["healthy_members"] == 3
    assert etcdctl(converged, "put hardening/probe yes").stdout.strip() == "OK"
