"""Operations of the dns role: zone files only on the primary, and a server answering a zone at
its expected serial."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import Link

from roles.dns.facts import ServedSerials
from toolkit.operations import put_checked, remember_file
from toolkit.pyinfra_api import inner
from toolkit.spec import ManagedFile

# A secondary picks a change up on the primary's NOTIFY, normally within a second or two.
SERVE_TIMEOUT_S = 60


def put_zone(zone: str, managed: ManagedFile | None) -> OperationMeta:
    """Every DNS server calls this for every zone, so all run the same operations; only the
    primary (which has the file) writes it."""
    meta = primary_zone(
        name=f"Write zone {zone}",
        zone=zone,
        content=managed.content if managed else None,
        dest=managed.path if managed else "",
        check=managed.check or "" if managed else "",
        group=managed.group if managed else "root",
    )
    if managed is not None:
        remember_file(meta, managed)  # the runner diffs it like any managed file
    return meta


@operation()
def primary_zone(zone: str, content: str | None, dest: str, check: str, group: str):
    """Write a zone file checked with named-checkzone; a secondary has nothing to write."""
    if content is None:
        host.noop(f"{zone}: this secondary receives the zone by transfer")
        return
    yield from inner(put_checked)(content=content, dest=dest, check=check, group=group)


@operation()
def zone_served(zone: str, serial: int, secondary: bool, zones: tuple[str, ...]):
    """Readiness: the local server answers the zone's SOA at the serial the inventory renders.
    A secondary that holds another serial is told to transfer the zone again: a secondary
    only follows a higher serial by itself, and a lost state directory (or a second controller)
    renders a lower one. Then waits up to SERVE_TIMEOUT_S."""
    served = host.get_fact(ServedSerials, zones=zones).get(zone.rstrip(".").lower())
    if served == serial:
        host.noop(f"{zone} is served at serial {serial}")
        return
    if secondary and served is not None:
        yield f"rndc retransfer {shlex.quote(zone)}"
    query = f"dig +short +norecurse +time=2 +tries=1 @127.0.0.1 SOA {shlex.quote(zone)}"
    yield (
        f"for i in $(seq {SERVE_TIMEOUT_S}); do "
        f"{query} | awk '{{print $3}}' | grep -qx {serial} && exit 0; sleep 1; done; "
        f"echo '{zone}: not served at serial {serial} after {SERVE_TIMEOUT_S} s' >&2; exit 1"
    )


@operation()
def regular_file(path: str):
    """Remove a symbolic link at `path` (systemd-resolved's resolv.conf into /run), so the
    managed file written next is a file of its own and not the link's target."""
    if host.get_fact(Link, path=path):
        yield f"rm -f {shlex.quote(path)}"
    else:
        host.noop(f"{path} is not a link")
