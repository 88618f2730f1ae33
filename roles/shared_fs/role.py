"""The shared_fs role's record: a CephFS on the storage hosts, mounted on every worker."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import FirewallRule, collapse_sources
from roles.shared_fs.config import SharedFsConfig
from toolkit.spec import Phase, Role, Rolling, lazy

MON_PORT = 6789
MSGR2_PORT = 3300
# The ports a storage host's OSD (8: public, cluster, two heartbeats, each msgr2 and v1), MDS
# (2) and manager (2) bind: Ceph's range from 6800 (ms_bind_port_min) narrowed in ceph.conf to
# what they use with room to spare, so the firewall opens each port by itself.
DAEMON_PORTS = range(6800, 6824)


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """Monitors and daemons from the node network: workers (clients) and the storage hosts
    themselves (replication, heartbeats)."""
    nodes = collapse_sources([str(loaded.cluster.networks.node)])
    rules = [FirewallRule("Ceph monitors", port, "tcp", nodes) for port in (MSGR2_PORT, MON_PORT)]
    rules += [
        FirewallRule("Ceph OSD, MDS and manager", port, "tcp", nodes) for port in DAEMON_PORTS
    ]
    return {"storage": rules}


ROLE = Role(
    name="shared_fs",
    config=SharedFsConfig,
    phases=(
        # A new cluster bootstraps together (monitors form quorum); a changed ceph.conf then
        # restarts the daemons one host at a time inside the deploy (`_serial`).
        Phase(
            ("storage",),
            lazy("roles.shared_fs.files:storage_files"),
            lazy("roles.shared_fs.deploy:apply_storage"),
            Rolling.together,
        ),
        Phase(
            ("gpu_worker", "cpu_worker"),
            lazy("roles.shared_fs.files:client_files"),
            lazy("roles.shared_fs.deploy:apply_client"),
        ),
    ),
    ports=ports,
    summary="CephFS on the storage hosts (or the site's CephFS/NFS/Lustre/BeeGFS), on every worker",
)
