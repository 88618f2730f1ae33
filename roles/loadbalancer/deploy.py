"""The loadbalancer role's deploy: HAProxy for the API servers, keepalived for the shared VIP."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server

from inventory.topology import HAPROXY_STATS_PORT
from roles.loadbalancer.facts import ServersHeldDown
from roles.loadbalancer.files import (
    HAPROXY_CONFIG,
    KEEPALIVED_CHECK,
    KEEPALIVED_CONFIG,
    managed_files,
    uses_keepalived,
)
from roles.loadbalancer.operations import haproxy_serving
from toolkit.effective import nothing_overrides, ours_or_declared, unit_dropins
from toolkit.operations import put_file, service_running, wait_for
from toolkit.spec import HostContext

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
    # A reload hands listening sockets to a new worker: open API connections are not cut. One
    # balancer at a time (`_serial`), each serving again before the next reloads: the role's
    # rolling policy, kept within a single apply step too.
    server.shell(
        name="Reload HAProxy, one balancer at a time, and wait for it to serve",
        commands=[
            "systemctl reload haproxy",
            wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{HAPROXY_STATS_PORT}/stats"),
        ],
        _serial=True,
        _if=haproxy_changed,
    )
    haproxy_serving(name="Restart HAProxy if it does not serve", stats_port=HAPROXY_STATS_PORT)
    held = host.get_fact(ServersHeldDown, port=HAPROXY_STATS_PORT) or []
    nothing_overrides(
        "Check that no API server is held out of rotation",
        [
            f"haproxy: server {server} through the runtime API (enable it again, or take the "
            "host out of the inventory)"
            for server in held
        ],
    )
    allowed = ours_or_declared(ctx)
    units = ("haproxy", "keepalived")
    unit_dropins("Check the drop-ins of HAProxy and keepalived", units, allowed)
    if not keepalived:
        return
    vrrp_files = [written[KEEPALIVED_CONFIG], written[KEEPALIVED_CHECK]]

    def vrrp_changed() -> bool:
        # did_change looked up at call time: the runner answers it for plans (see runner).
        return any(meta.did_change() for meta in vrrp_files)

    service_running(name="Run keepalived", unit="keepalived")
    server.shell(
        name="Reload keepalived, one balancer at a time, and wait for it to run",
        commands=[
            "systemctl reload keepalived",
            wait_for("systemctl is-active --quiet keepalived"),
        ],
        _serial=True,
        _if=vrrp_changed,
    )
