"""Files the base role manages on every host."""

from __future__ import annotations

from roles.base.config import BaseConfig
from toolkit.distributions import DISTRIBUTIONS
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

APT_CONF_FILE = "/etc/apt/apt.conf.d/90gpuinfra"
JOURNALD_FILE = "/etc/systemd/journald.conf.d/50-gpuinfra.conf"
# Where journald reads its drop-ins, an earlier folder hiding a file of the same name in a later
# one (journald.conf(5)).
JOURNALD_CONF_DIRS = tuple(
    f"{root}/systemd/journald.conf.d" for root in ("/etc", "/run", "/usr/local/lib", "/usr/lib")
)


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = ctx.config(BaseConfig)
    family, codename, default_mirror = DISTRIBUTIONS[ctx.cluster.os]
    hosts = hosts_entries(ctx)
    resolved_by_dns = ctx.topology.dns_primary is not None

    def file(path: str, template: str, check: str | None = None, **extra: object) -> ManagedFile:
        content = render_template(
            f"base/{template}", cfg=cfg, ctx=ctx, cluster=ctx.cluster, **extra
        )
        return ManagedFile("base", path, content, check=check)

    return [
        file("/etc/hostname", "hostname.j2"),
        file("/etc/hosts", "hosts.j2", hosts=hosts, resolved_by_dns=resolved_by_dns),
        file(
            "/etc/apt/sources.list.d/gpuinfra.sources",
            "apt.sources.j2",
            family=family,
            codename=codename,
            mirror=cfg.apt_mirror or default_mirror,
        ),
        file(APT_CONF_FILE, "apt.conf.j2"),
        file("/etc/chrony/sources.d/gpuinfra.sources", "chrony.sources.j2"),
        file(JOURNALD_FILE, "journald.conf.j2"),
        # A drop-in that sshd rejects never goes live: a broken sshd locks the operator out.
        file("/etc/ssh/sshd_config.d/50-gpuinfra.conf", "sshd.conf.j2", check="sshd -t -f {path}"),
    ]


def hosts_entries(ctx: HostContext) -> list[tuple[str, str, str]]:
    """(address, fqdn, short name) lines of the host's /etc/hosts.

    Without DNS servers in the inventory, every host of the cluster: nothing else resolves them.
    With DNS servers, hosts resolve each other through the cluster's DNS (the dns role points
    /etc/resolv.conf at it), and /etc/hosts holds only what must resolve before DNS answers or
    while it does not: the host itself (hostname -f, sudo, a bootstrap before the dns phase),
    the DNS servers (by address in resolv.conf; by name here for operators and zone transfers)
    and the API endpoint (kubelet and kubeadm reach api.<domain>: a DNS outage must not cut
    nodes off the API). etcd members are not listed: etcd's peers and clients, and the API
    servers' --etcd-servers, name them by address (topology.etcd_initial_cluster), never by
    name. Listing every host would make each host's file, and every render and drift check of
    it, grow with the fleet: 7,500 lines on each of 7,500 hosts, 56 million lines in all.
    """
    cluster, topology = ctx.cluster, ctx.topology
    if topology.dns_primary is None:
        names = list(cluster.hosts)
    else:
        servers = [topology.dns_primary, *topology.dns_secondaries]
        names = list(dict.fromkeys([ctx.name, *servers]))
    entries = [(str(cluster.hosts[name].address), cluster.fqdn(name), name) for name in names]
    if topology.api_address:
        entries.append((topology.api_address, f"api.{cluster.domain}", "api"))
    return entries
