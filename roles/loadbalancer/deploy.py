"""The loadbalancer role's deploy: HAProxy for the API servers, keepalived for the shared VIP."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from inventory.topology import HAPROXY_STATS_PORT
from roles.loadbalancer.files import (
    HAPROXY_CONFIG,
    KEEPALIVED_CHECK,
    KEEPALIVED_CONFIG,
    managed_files,
    uses_keepalived,
)
from roles.loadbalancer.operations import haproxy_serving
from roles.operations import put_file, service_running, wait_for
from roles.spec import HostContext

# socat: the way to talk to HAProxy's runtime API socket (show stat, disable server...).
PACKAGES = ["haproxy", "socat"]


@deploy("Load balancer")
def apply(ctx: HostContext) -> None:
    # The keepalived branch depends only on the cluster (how many balancers, a VIP or not), so
    # every balancer in the phase runs the same sequence of operations.
    keepalived = uses_keepalived(ctx.cluster)
    apt.packages(
        name="Install HAProxy",
        packages=PACKAGES + (["keepalived"] if keepalived else []),
        no_recommends=True,
    )
    written = {f.path: put_file(f) for f in managed_files(ctx)}
    haproxy_changed = written[HAPROXY_CONFIG].did_change
    service_running(name="Run HAProxy", unit="haproxy")
    # A reload hands listening sockets to a new worker: open API connections are not cut.
    systemd.service(name="Reload HAProxy", service="haproxy", reloaded=True, _if=haproxy_changed)
    server.shell(
        name="Wait for HAProxy to serve its stats",
        commands=[wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{HAPROXY_STATS_PORT}/stats")],
        _if=haproxy_changed,
    )
    haproxy_serving(name="Restart HAProxy if it does not serve", stats_port=HAPROXY_STATS_PORT)
    if not keepalived:
        return
    vrrp_files = [written[KEEPALIVED_CONFIG], written[KEEPALIVED_CHECK]]

    def vrrp_changed() -> bool:
        # did_change looked up at call time: the runner answers it for plans (see runner).
        return any(meta.did_change() for meta in vrrp_files)

    service_running(name="Run keepalived", unit="keepalived")
    systemd.service(
        name="Reload keepalived",
        service="keepalived",
        reloaded=True,
        _if=vrrp_changed,
    )
    server.shell(
        name="Wait for keepalived to run",
        commands=[wait_for("systemctl is-active --quiet keepalived")],
        _if=vrrp_changed,
    )
