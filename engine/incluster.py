"""What the two in-cluster Jobs (`drift --job`, `apply --job`) share below the day-2 flows:
kubectl on the first control-plane node with admin.conf, and in the pod, the key the Secret
mounts copied 0400 into memory and the exit code of a pod stopped by SIGTERM."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

from inventory.model import LoadedCluster
from toolkit.remote import RemoteRunner

# The kubernetes role's admin kubeconfig on cp-1 (roles/kubernetes/kubeadm.py ADMIN_CONF; the
# engine reaches roles only through the registry; tests/unit/test_rollout_job.py keeps them
# equal), and kubectl as the day-2 flows run it (day2/kubernetes.py KUBECTL).
ADMIN_CONF = "/etc/kubernetes/admin.conf"
KUBECTL = f"kubectl --kubeconfig {ADMIN_CONF} --request-timeout=30s"
# A shard stopped before it ended (its pod deleted, evicted or drained): the exit code a shell
# gives a process ended by SIGTERM, so the Job counts the pod failed and starts the shard again.
TERMINATED = 128 + signal.SIGTERM


def kubectl_command(namespace: str, command: str) -> str:
    return f"{KUBECTL} -n {shlex.quote(namespace)} {command}"


def remote_kubectl(loaded: LoadedCluster, host: str, namespace: str, runner: RemoteRunner):
    """kubectl on `host` with admin.conf: `(command, stdin) -> (exit code, stdout, stderr)`, as
    `fleetgate.KubectlApi` calls it; stdin (a Secret, a manifest) never on a command line."""

    def call(command: str, stdin: bytes | None) -> tuple[int, str, str]:
        extra = {"stdin": stdin} if stdin is not None else {}
        result = runner(loaded, host, kubectl_command(namespace, command), timeout=120, **extra)
        return result.exit_code, result.stdout, result.stderr

    return call


def copy_key(source: Path, target: Path) -> None:
    """The Secret's key where ssh reads it, 0400 from its first byte: the mount is
    group-readable (fsGroup), which ssh and the inventory's check refuse."""
    data = source.read_bytes()
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
