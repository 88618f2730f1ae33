"""Lab names and the address plan: every lab gets names and a subnet no other lab can share."""

from __future__ import annotations

import ipaddress

import pytest

from lab import addressing
from lab.errors import LabInvalid
from lab.naming import IFNAME_MAX, LabNames, check_lab_name, netns_prefix_of, nft_table_of


@pytest.mark.parametrize("name", ["lab", "itest", "lab-2", "a", "x" * 24])
def test_valid_lab_names(name: str) -> None:
    assert check_lab_name(name) == name


@pytest.mark.parametrize("name", ["", "Lab", "2lab", "lab-", "lab_2", "lab.2", "x" * 25, "a b"])
def test_invalid_lab_names(name: str) -> None:
    with pytest.raises(LabInvalid, match="invalid lab name"):
        check_lab_name(name)


def test_sample_is_reserved() -> None:
    with pytest.raises(LabInvalid, match="reserved"):
        check_lab_name("sample")


def test_interface_names_fit_the_kernel_limit_at_the_extremes() -> None:
    names = LabNames("x" * 24, addressing.SLOTS - 1)
    last = addressing.max_hosts() - 1
    for ifname in (names.bridge, names.veth_outside(last), names.veth_inside(last)):
        assert len(ifname) <= IFNAME_MAX


def test_names_of_two_labs_never_collide() -> None:
    first, second = LabNames("lab", 0), LabNames("lab-2", 1)
    assert first.bridge != second.bridge
    assert first.veth_outside(0) != second.veth_outside(0)
    assert first.netns("etcd-1") != second.netns("etcd-1")
    assert first.nft_table != second.nft_table
    assert first.state_dir != second.state_dir


def test_netns_prefix_does_not_match_a_lab_whose_name_extends_another() -> None:
    # "lab" must never find the namespaces of "lab-2" when it looks for its own.
    assert not LabNames("lab-2", 1).netns("etcd-1").startswith(netns_prefix_of("lab"))


def test_nft_table_names_are_valid_identifiers_and_distinct() -> None:
    assert nft_table_of("lab-a") == "gpuinfra_lab_lab_a"
    assert nft_table_of("lab-a") != nft_table_of("laba")
    assert "-" not in nft_table_of("a-b-c")


def test_every_lab_subnet_is_inside_the_benchmark_range_and_disjoint() -> None:
    subnets = [addressing.subnet_of(slot) for slot in range(addressing.SLOTS)]
    assert subnets[0] == ipaddress.IPv4Network("198.18.0.0/22")
    assert subnets[-1] == ipaddress.IPv4Network("198.19.252.0/22")
    assert all(subnet.subnet_of(addressing.SUPERNET) for subnet in subnets)
    assert len({subnet.network_address for subnet in subnets}) == addressing.SLOTS


def test_host_addresses_skip_gateway_and_virtual_address() -> None:
    subnet = addressing.subnet_of(3)
    addresses = [addressing.host_address(subnet, index) for index in range(200)]
    assert addresses[0] == ipaddress.IPv4Address("198.18.12.10")
    assert addressing.gateway(subnet) not in addresses
    assert addressing.virtual_address(subnet) not in addresses
    assert all(address in subnet for address in addresses)


def test_a_lab_holds_at_most_its_subnet() -> None:
    subnet = addressing.subnet_of(0)
    last = addressing.host_address(subnet, addressing.max_hosts() - 1)
    assert last == subnet.broadcast_address - 1
    with pytest.raises(Exception, match="at most"):
        addressing.host_address(subnet, addressing.max_hosts())


def test_slot_of_maps_addresses_back() -> None:
    assert addressing.slot_of(ipaddress.IPv4Address("198.18.12.10")) == 3
    assert addressing.slot_of(ipaddress.IPv4Address("10.0.0.1")) is None


def test_free_slot_takes_the_lowest_unused() -> None:
    assert addressing.free_slot([]) == 0
    assert addressing.free_slot([0, 1, 3]) == 2
    with pytest.raises(Exception, match="in use"):
        addressing.free_slot(range(addressing.SLOTS))
