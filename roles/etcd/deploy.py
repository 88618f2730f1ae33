"""The etcd role's deploy: data disk, disk gate, certificates, the unit, then the members.

A new cluster bootstraps all members together (they start in the same operation). Afterwards a
change that needs a restart rolls through the members one at a time (`_serial`), and each
restart (`etcd-restart-member`: leadership moved off first, steps logged to the journal) returns
only when the member and the whole cluster are healthy again, so a bad change stops on the
first member with the others still serving.

With etcd.events on, the Events cluster's members (clusters.py) follow the same steps after the
main cluster's, in operations of their own: the main roll has finished on every member before
the Events roll begins, so at most one member of either cluster is down at any moment.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files, server, systemd

from roles.etcd import operations as etcd_ops
from roles.etcd.clusters import MAIN, EtcdCluster, clusters
from roles.etcd.config import EtcdConfig
from roles.etcd.facts import Members
from roles.etcd.files import DATA_UNIT, client_files, managed_files, restarting_files, settings
from toolkit.effective import nothing_overrides, ours_or_declared, unit_dropins
from toolkit.facts import SupplementaryGroups, UnitState
from toolkit.operations import put_file, system_account
from toolkit.spec import HostContext


@deploy("Etcd")
def apply(ctx: HostContext) -> None:
    cfg = settings(ctx)
    system_account(
        name="Create the etcd user and group", user="etcd", group="etcd", home=cfg.data_dir
    )
    tools = ["fio", "xfsprogs" if cfg.filesystem == "xfs" else "e2fsprogs"]
    apt.packages(name="Install filesystem tools and fio", packages=tools, no_recommends=True)
    etcd_ops.data_disk(
        name="Prepare the data disk",
        device=ctx.host.etcd.disk if ctx.host.etcd else None,
        mountpoint=cfg.data_dir,
        filesystem=cfg.filesystem,
    )
    files.directory(
        name="Own the data directory (0700)",
        path=cfg.data_dir,
        user="etcd",
        group="etcd",
        mode="0700",
    )
    etcd_ops.disk_gate(
        name="Check the data disk's fsync latency",
        data_dir=cfg.data_dir,
        limit_ms=cfg.fsync_p99_max_ms,
        override=cfg.disk_gate_override,
    )
    etcd_ops.disk_gate_barrier(
        name="Stop unless every new member passed the disk gate", data_dir=cfg.data_dir
    )

    for etcd in clusters(cfg)[1:]:
        files.directory(
            name=f"Own the {etcd.title} data directory (0700)",
            path=etcd.data_dir(cfg),
            user="etcd",
            group="etcd",
            mode="0700",
        )

    written = {f.path: put_file(f) for f in managed_files(ctx)}
    units = [written[DATA_UNIT]] + [
        written[path]
        for etcd in clusters(cfg)
        for path in (etcd.unit_file, etcd.backup_unit, etcd.backup_timer)
    ]
    systemd.daemon_reload(
        name="Reload systemd for changed units", _if=lambda: any(u.did_change() for u in units)
    )
    installed = None
    for etcd in clusters(cfg):
        restart_on = [meta for path, meta in written.items() if path in restarting_files(etcd)]
        installed = members_running(ctx, cfg, etcd, restart_on, installed)
    declared = ours_or_declared(ctx)
    dropins = [unit for etcd in clusters(cfg) for unit in (etcd.name, f"{etcd.name}-backup.timer")]
    unit_dropins("Check the drop-ins of etcd", tuple(dropins), declared)
    # The member list is the cluster's, the same through every member: the first member asks
    # it (each member's own health is the health checks'), the others spare drift an etcdctl.
    if ctx.name == ctx.cluster.in_group("etcd")[0]:
        for etcd in clusters(cfg):
            members = host.get_fact(Members, env_file=etcd.etcdctl_env) or []
            nothing_overrides(
                f"Check that {etcd.title} has no member the inventory lacks",
                foreign_members(members, etcd.initial_cluster(ctx.loaded)),
            )
    groups = host.get_fact(SupplementaryGroups, user="etcd") or []
    nothing_overrides(
        "Check that the etcd user is in no other group",
        [f"etcd: the etcd user is also in {', '.join(groups)} (gpuinfra runs etcd as etcd alone)"]
        if groups
        else [],
    )


def members_running(
    ctx: HostContext,
    cfg: EtcdConfig,
    etcd: EtcdCluster,
    restart_on: list[OperationMeta],
    installed: OperationMeta | None,
) -> OperationMeta:
    """One cluster's members: etcd installed (once, before the main cluster's start), started
    together on a new cluster, else restarted one member at a time when a file they read or the
    version changed. Returns the installation, which restarts the Events members too."""
    # Whether the member ran before this run: a running member is only ever restarted by the
    # serial operation below, also for a new version (the package's own restart is held back).
    was_running = (host.get_fact(UnitState, unit=etcd.name) or {}).get("ActiveState") == "active"
    if installed is None:
        installed = etcd_ops.etcd_installed(
            name="Install etcd", cfg=cfg, version=ctx.cluster.versions.etcd
        )
    # Every member starts in this one operation: a new cluster bootstraps all together.
    started = etcd_ops.unit_running(name=f"Start {etcd.title}", unit=etcd.name)
    server.shell(
        name="Wait for the new cluster to be healthy"
        if etcd is MAIN
        else f"Wait for the new {etcd.title} cluster to be healthy",
        commands=[f"{etcd.wait_healthy} {cfg.health_timeout_s}"],
        _if=lambda: installed.did_change() or started.did_change(),
    )
    server.shell(
        name=f"Restart {etcd.title}, one member at a time, each waiting for a healthy cluster",
        commands=[f"{etcd.restart_member} {cfg.health_timeout_s}"],
        _serial=True,
        _if=lambda: (
            was_running
            and (installed.did_change() or any(meta.did_change() for meta in restart_on))
        ),
    )
    etcd_ops.unit_running(
        name="Schedule snapshots" if etcd is MAIN else f"Schedule {etcd.title} snapshots",
        unit=f"{etcd.name}-backup.timer",
    )
    return installed


def foreign_members(members: list[tuple[str, str, bool]], initial_cluster: str) -> list[str]:
    """A finding for each member that is not one of the inventory's (by name and peer URL) and
    for each learner: a member the inventory lacks votes, or will, on every write. A member of
    the inventory missing from the list is the health checks' and `etcd replace`'s to answer."""
    expected = dict(entry.split("=", 1) for entry in initial_cluster.split(",") if entry)
    findings = []
    for name, peer, learner in members:
        if expected.get(name) != peer:
            findings.append(
                f"etcd: member {name or '(not started)'} at {peer} is not in the inventory"
            )
        elif learner:
            findings.append(f"etcd: member {name} is a learner (promote it or remove it)")
    return findings


@deploy("Etcd clients")
def apply_clients(ctx: HostContext) -> None:
    """The API servers' etcd CA and client certificate (kubeadm's external-etcd layout)."""
    for managed in client_files(ctx):
        put_file(managed)
