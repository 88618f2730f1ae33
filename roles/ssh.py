"""The OpenSSH client command line for reaching a cluster host, with host keys always checked."""

from __future__ import annotations

from inventory.model import LoadedCluster


def ssh_argv(loaded: LoadedCluster, host: str, *, batch: bool = True) -> list[str]:
    """argv for `ssh` to one inventory host; append the remote command to it.

    Strict host-key checking against the cluster's known_hosts file is never turned off: an
    unknown or changed host key makes ssh refuse, and the caller reports that host as failed.
    """
    cluster = loaded.cluster
    settings = cluster.ssh
    argv = [
        "ssh",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={loaded.resolve(settings.known_hosts)}",
        "-o", "ConnectTimeout=10",
        "-p", str(settings.port),
        "-l", settings.user,
    ]  # fmt: skip
    if batch:
        argv += ["-o", "BatchMode=yes"]
    if settings.key is not None:
        argv += ["-i", str(loaded.resolve(settings.key)), "-o", "IdentitiesOnly=yes"]
    if settings.bastion:
        argv += ["-J", settings.bastion]
    argv.append(str(cluster.hosts[host].address))
    return argv
