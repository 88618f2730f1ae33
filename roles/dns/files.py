"""Files of the dns role: Bind9's options, zones and transfer key on the DNS servers, and
/etc/resolv.conf on every host."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from inventory.topology import DNSRecord
from roles.dns.config import DnsConfig
from roles.dns.secrets import TSIG_ALGORITHM, TSIG_KEY_NAME, tsig_secret, zone_serial
from toolkit import clock
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

BIND_DIR = "/etc/bind"
KEY_FILE = f"{BIND_DIR}/{TSIG_KEY_NAME}.key"
OPTIONS_FILE = f"{BIND_DIR}/named.conf.options"
LOCAL_FILE = f"{BIND_DIR}/named.conf.local"
PRIMARY_ZONE_DIR = f"{BIND_DIR}/zones"
# Debian's AppArmor profile lets named write here: transferred zones live on the secondaries.
SECONDARY_ZONE_DIR = "/var/lib/bind"
RESOLV_CONF = "/etc/resolv.conf"
# glibc reads at most three nameserver lines (MAXNS).
MAX_NAMESERVERS = 3


@dataclass(frozen=True)
class Zone:
    name: str
    records: tuple[DNSRecord, ...]

    @property
    def primary_file(self) -> str:
        return f"{PRIMARY_ZONE_DIR}/db.{self.name}"

    @property
    def secondary_file(self) -> str:
        return f"{SECONDARY_ZONE_DIR}/db.{self.name}"


def zones(ctx: HostContext) -> list[Zone]:
    """The forward zone, then one reverse zone per /24 holding hosts."""
    topology = ctx.topology
    forward = [Zone(topology.forward_zone, topology.forward_records)]
    return forward + [Zone(name, records) for name, records in topology.reverse_zones.items()]


def is_primary(ctx: HostContext) -> bool:
    return ctx.topology.dns_primary == ctx.name


def server_addresses(ctx: HostContext, names: list[str] | tuple[str, ...]) -> list[str]:
    return [str(ctx.cluster.hosts[name].address) for name in names]


@dataclass(frozen=True)
class RenderedZone:
    content: str
    serial: int


def render_zone(
    ctx: HostContext, zone: Zone, today: Callable[[], datetime.date] = clock.today
) -> RenderedZone:
    """The zone file; its serial comes from the digest of everything else in it."""
    cfg = ctx.config(DnsConfig)
    servers = [ctx.topology.dns_primary, *ctx.topology.dns_secondaries]

    def text(serial: int) -> str:
        return render_template(
            "dns/zone.j2",
            cfg=cfg,
            zone=zone,
            serial=serial,
            nameservers=[f"{ctx.cluster.fqdn(name)}." for name in servers if name],
            primary=f"{ctx.cluster.fqdn(servers[0])}." if servers[0] else "",
            hostmaster=f"hostmaster.{ctx.cluster.domain}.",
        )

    digest = hashlib.sha256(text(0).encode()).hexdigest()
    loaded = ctx.loaded
    serial = zone_serial(loaded.state_dir, zone.name, digest, today, loaded.state_access)
    return RenderedZone(text(serial), serial)


def zone_file(ctx: HostContext, zone: Zone) -> ManagedFile:
    return ManagedFile(
        "dns",
        zone.primary_file,
        render_zone(ctx, zone).content,
        group="bind",
        check=f"named-checkzone {zone.name} {{path}}",
    )


def config_files(ctx: HostContext) -> list[ManagedFile]:
    """Transfer key and options, the same shape on every DNS server."""
    cfg = ctx.config(DnsConfig)
    networks = ctx.cluster.networks
    key = render_template(
        "dns/transfer.key.j2",
        key_name=TSIG_KEY_NAME,
        algorithm=TSIG_ALGORITHM,
        secret=tsig_secret(ctx.loaded.state_dir, ctx.loaded.state_access),
    )
    options = render_template(
        "dns/named.conf.options.j2",
        cfg=cfg,
        cluster_networks=[str(networks.node), str(networks.pod), str(networks.service)],
        admin_networks=[str(net) for net in networks.admin],
    )
    return [
        ManagedFile(
            "dns",
            KEY_FILE,
            key,
            mode="0640",
            group="bind",
            secret=True,
            check="named-checkconf {path}",
        ),  # fmt: skip
        ManagedFile("dns", OPTIONS_FILE, options, group="bind", check="named-checkconf {path}"),
    ]


def local_file(ctx: HostContext) -> ManagedFile:
    """The zones: primary or secondary. Its check (`named-checkconf -z`) loads the primary's
    zone files, so those are written before it."""
    topology = ctx.topology
    local = render_template(
        "dns/named.conf.local.j2",
        zones=zones(ctx),
        primary=is_primary(ctx),
        key_file=KEY_FILE,
        key_name=TSIG_KEY_NAME,
        primary_address=server_addresses(ctx, [topology.dns_primary or ctx.name])[0],
        secondaries=server_addresses(ctx, topology.dns_secondaries),
    )
    return ManagedFile("dns", LOCAL_FILE, local, group="bind", check="named-checkconf -z {path}")


def server_files(ctx: HostContext) -> list[ManagedFile]:
    """Every file of a DNS server, in the order they are written."""
    files = config_files(ctx)
    if is_primary(ctx):
        files += [zone_file(ctx, zone) for zone in zones(ctx)]
    return [*files, local_file(ctx)]


def client_files(ctx: HostContext) -> list[ManagedFile]:
    """/etc/resolv.conf naming the cluster's DNS servers; nothing without DNS servers."""
    topology = ctx.topology
    if topology.dns_primary is None:
        return []
    cfg = ctx.settings["dns"]
    servers = [topology.dns_primary, *topology.dns_secondaries][:MAX_NAMESERVERS]
    content = render_template(
        "dns/resolv.conf.j2",
        cfg=cfg,
        domain=ctx.cluster.domain,
        nameservers=server_addresses(ctx, servers),
    )
    return [ManagedFile("dns", RESOLV_CONF, content)]
