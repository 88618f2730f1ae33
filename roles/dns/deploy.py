"""The dns role's deploy: Bind9 on the DNS servers (checked, reloaded, then asked for every
zone), and every host's resolver pointed at them."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server

from roles.dns.files import (
    RESOLV_CONF,
    client_files,
    config_files,
    is_primary,
    local_file,
    render_zone,
    zone_file,
    zones,
)
from roles.dns.operations import put_zone, regular_file, zone_served
from toolkit.operations import put_file, service_running
from toolkit.spec import HostContext

SERVER_PACKAGES = ["bind9", "bind9-dnsutils"]
# dig, for checks and for operators on every host.
CLIENT_PACKAGES = ["bind9-dnsutils"]


@deploy("DNS server")
def apply_server(ctx: HostContext) -> None:
    # Primary and secondaries run the same operations (pyinfra matches them by position): the
    # zone writes do nothing on a secondary.
    apt.packages(name="Install Bind9", packages=SERVER_PACKAGES, no_recommends=True)
    written = [put_file(managed) for managed in config_files(ctx)]
    primary = is_primary(ctx)
    for zone in zones(ctx):
        written.append(put_zone(zone.name, zone_file(ctx, zone) if primary else None))
    written.append(put_file(local_file(ctx)))

    def changed() -> bool:
        return any(meta.did_change() for meta in written)

    service_running(name="Run Bind9", unit="named")
    server.shell(
        name="Check the whole Bind9 configuration",
        commands=["named-checkconf -z /etc/bind/named.conf"],
        _if=changed,
    )
    # One server at a time (`_serial`): the others keep answering while one reloads.
    server.shell(
        name="Reload Bind9, one server at a time",
        commands=["systemctl reload named"],
        _serial=True,
        _if=changed,
    )
    served = zones(ctx)
    names = tuple(zone.name for zone in served)  # one fact, one `dig`, for all of them
    for zone in served:
        zone_served(
            name=f"Check {zone.name} is served",
            zone=zone.name,
            serial=render_zone(ctx, zone).serial,
            secondary=not primary,
            zones=names,
        )


@deploy("DNS client")
def apply_client(ctx: HostContext) -> None:
    files = client_files(ctx)
    if not files:
        return  # no DNS servers in the cluster: the resolver stays as it is, on every host
    apt.packages(name="Install dig", packages=CLIENT_PACKAGES, no_recommends=True)
    # systemd-resolved makes resolv.conf a link into /run: a file of our own replaces it.
    regular_file(name=f"Make {RESOLV_CONF} a plain file", path=RESOLV_CONF)
    for managed in files:
        put_file(managed)
