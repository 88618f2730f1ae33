"""The lab address plan: one subnet per lab carved out of 198.18.0.0/15, never routed anywhere."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from lab.errors import LabError

# RFC 2544's benchmarking range: reserved, never routed, so lab traffic cannot leak anywhere.
SUPERNET = ipaddress.IPv4Network("198.18.0.0/15")
# A /22 per lab: 1013 host addresses, room for the 200-host scale runs with margin.
LAB_PREFIX = 22
SLOTS = 2 ** (LAB_PREFIX - SUPERNET.prefixlen)
# .1 is the bridge (the hosts' gateway); .2 to .9 stay free for virtual addresses (api.vip).
GATEWAY_OFFSET = 1
VIP_OFFSET = 5
FIRST_HOST_OFFSET = 10


def subnet_of(slot: int) -> ipaddress.IPv4Network:
    if not 0 <= slot < SLOTS:
        raise LabError(f"lab slot {slot} is outside 0..{SLOTS - 1}")
    return list(SUPERNET.subnets(new_prefix=LAB_PREFIX))[slot]


def slot_of(address: ipaddress.IPv4Address) -> int | None:
    """Which lab slot an address falls into, or None outside the lab range."""
    if address not in SUPERNET:
        return None
    return (int(address) - int(SUPERNET.network_address)) >> (32 - LAB_PREFIX)


def gateway(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    return subnet.network_address + GATEWAY_OFFSET


def virtual_address(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    return subnet.network_address + VIP_OFFSET


def host_address(subnet: ipaddress.IPv4Network, index: int) -> ipaddress.IPv4Address:
    """The address of the lab's index-th host (0-based)."""
    address = subnet.network_address + FIRST_HOST_OFFSET + index
    if address >= subnet.broadcast_address:
        capacity = subnet.num_addresses - FIRST_HOST_OFFSET - 1
        raise LabError(f"a lab holds at most {capacity} hosts (subnet {subnet})")
    return address


def max_hosts() -> int:
    return 2 ** (32 - LAB_PREFIX) - FIRST_HOST_OFFSET - 1


def free_slot(used: Iterable[int]) -> int:
    """The lowest slot no other lab (recorded or seen on the machine) is using."""
    taken = set(used)
    for slot in range(SLOTS):
        if slot not in taken:
            return slot
    raise LabError(f"all {SLOTS} lab subnets in {SUPERNET} are in use: take a lab down first")
