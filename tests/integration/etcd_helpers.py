"""etcd helpers shared by the etcd integration modules: etcdctl from cp-1 with the API server's
client certificate against every member of the lab's etcd group, and `gpuinfra etcd status`."""

from __future__ import annotations

import json
import time

from cli.exitcodes import ExitCode
from tests.integration.roles_helpers import gpuinfra

CLIENT_ENV = (
    "ETCDCTL_CACERT=/etc/kubernetes/pki/etcd/ca.crt "
    "ETCDCTL_CERT=/etc/kubernetes/pki/apiserver-etcd-client.crt "
    "ETCDCTL_KEY=/etc/kubernetes/pki/apiserver-etcd-client.key"
)


def endpoints(lab) -> str:
    return ",".join(f"https://{lab.address(m)}:2379" for m in lab.loaded.cluster.in_group("etcd"))


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
