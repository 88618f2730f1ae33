"""The data_disks role's record: the workers' dataset and checkpoint volumes, in batches."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import LoadedCluster
from roles.data_disks.config import DataDisksConfig
from toolkit.spec import HostSettings, Phase, Role, Rolling, lazy

# Datasets and checkpoints live on the workers; etcd has its own disk (etcd.disk) and the other
# groups keep their data on the system disk.
GROUPS = ("gpu_worker", "cpu_worker")


def volumes_only_on_workers(
    loaded: LoadedCluster, settings: HostSettings
) -> Iterator[tuple[str, str]]:
    """A volume set on a host the role does not target would never be made: an error."""
    for name, host in loaded.cluster.hosts.items():
        cfg = settings.get(name, {}).get("data_disks")
        if cfg is not None and cfg.volumes and not set(GROUPS) & set(host.groups):
            yield (
                f"hosts.{name}",
                f"data_disks.volumes: only {' and '.join(GROUPS)} hosts get data volumes",
            )


ROLE = Role(
    name="data_disks",
    config=DataDisksConfig,
    phases=(Phase(GROUPS, None, lazy("roles.data_disks.deploy:apply"), Rolling.batches),),
    checks=volumes_only_on_workers,
    summary="data disks by stable name: one disk or mdadm RAID 0, formatted only when blank",
)
