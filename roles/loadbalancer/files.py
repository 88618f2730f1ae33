"""Files the loadbalancer role manages: haproxy.cfg, and keepalived for a shared VIP."""

from __future__ import annotations

import ipaddress
import secrets
import string

from inventory.model import Cluster, LoadedCluster
from inventory.topology import HAPROXY_STATS_PORT
from roles.loadbalancer.config import LoadBalancerConfig
from toolkit.spec import HostContext, ManagedFile
from toolkit.statefiles import kept_secret
from toolkit.templates import render_template

HAPROXY_CONFIG = "/etc/haproxy/haproxy.cfg"
HAPROXY_SOCKET = "/run/haproxy/admin.sock"
KEEPALIVED_CONFIG = "/etc/keepalived/keepalived.conf"
KEEPALIVED_CHECK = "/etc/keepalived/check-haproxy.sh"
# keepalived uses the first 8 characters of a PASS authentication string (RFC 2338's field).
VRRP_PASSWORD_LENGTH = 8
VRRP_SECRET = "loadbalancer/vrrp-password.secret"  # under the cluster's .state/
# The first balancer gets the highest priority and so holds the address while it is healthy.
TOP_PRIORITY = 150
PRIORITY_STEP = 10


def uses_keepalived(cluster: Cluster) -> bool:
    """A virtual address is only worth a VRRP daemon when it can move: two or more balancers."""
    return cluster.api.vip is not None and len(cluster.in_group("loadbalancer")) > 1


def vrrp_priority(cluster: Cluster, host: str) -> int:
    """Priorities by inventory order: 150, 140, 130... (VRRP's range is 1-254)."""
    index = cluster.in_group("loadbalancer").index(host)
    return max(1, TOP_PRIORITY - PRIORITY_STEP * index)


def virtual_router_id(cluster: Cluster, cfg: LoadBalancerConfig) -> int:
    if cfg.virtual_router_id is not None:
        return cfg.virtual_router_id
    assert cluster.api.vip is not None
    return int(cluster.api.vip) % 255 + 1


def vrrp_password(loaded: LoadedCluster, cfg: LoadBalancerConfig) -> str:
    """The inventory's password, or a random one apply generates once and keeps in the
    cluster's state (0600), like the TSIG key: nobody can work it out from the inventory."""
    if cfg.vrrp_password is not None:
        return cfg.vrrp_password
    alphabet = string.ascii_letters + string.digits

    def generate() -> str:
        return "".join(secrets.choice(alphabet) for _ in range(VRRP_PASSWORD_LENGTH))

    return kept_secret(loaded.state_dir, VRRP_SECRET, generate, loaded.state_access)


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = ctx.config(LoadBalancerConfig)
    cluster = ctx.cluster
    haproxy = render_template(
        "loadbalancer/haproxy.cfg.j2",
        cfg=cfg,
        cluster=cluster,
        backends=ctx.topology.api_backends,
        socket=HAPROXY_SOCKET,
        stats_port=HAPROXY_STATS_PORT,
    )
    # haproxy refuses to start on an invalid file: it never replaces the running one.
    files = [ManagedFile("loadbalancer", HAPROXY_CONFIG, haproxy, check="haproxy -c -q -f {path}")]
    if not uses_keepalived(cluster):
        return files
    balancers = cluster.in_group("loadbalancer")
    vip = ipaddress.IPv4Interface(f"{cluster.api.vip}/{cluster.networks.node.prefixlen}")
    check = render_template("loadbalancer/check-haproxy.sh.j2", api_port=cluster.api.port)
    keepalived = render_template(
        "loadbalancer/keepalived.conf.j2",
        cfg=cfg,
        ctx=ctx,
        vip=vip,
        priority=vrrp_priority(cluster, ctx.name),
        router_id=virtual_router_id(cluster, cfg),
        password=vrrp_password(ctx.loaded, cfg),
        peers=[str(cluster.hosts[name].address) for name in balancers if name != ctx.name],
        check_script=KEEPALIVED_CHECK,
    )
    return files + [
        ManagedFile("loadbalancer", KEEPALIVED_CHECK, check, mode="0755"),
        ManagedFile(
            "loadbalancer",
            KEEPALIVED_CONFIG,
            keepalived,
            mode="0640",
            secret=True,
            check="keepalived --config-test --use-file {path}",
        ),
    ]
