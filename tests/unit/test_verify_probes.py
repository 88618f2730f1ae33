"""The firewall's negative probes cannot pass on a target that is down: each "dropped" answer
needs a positive control (SSH answering on the same target, from the same host) just before.

Stand-in: a fake testinfra host answering bash's /dev/tcp probes as a given network would (a
lab host cannot be made to show every case on demand); the suites' own functions run on it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from tests.verify.firewall import test_etcd_from_control_plane as from_control_plane
from tests.verify.firewall import test_etcd_from_workers as from_workers
from tests.verify.probes import ControlFailed


@dataclass
class Ran:
    rc: int


class FakeHost:
    """Answers `timeout N bash -c 'exec 3<>/dev/tcp/ADDRESS/PORT'` by port: 0 open,
    124 no answer (dropped, or nobody there), 1 refused."""

    def __init__(self, answers: dict[int, int], default: int = 124) -> None:
        self.answers, self.default = answers, default

    def run(self, command: str) -> Ran:
        port = int(re.search(r"/dev/tcp/[^/]+/(\d+)", command).group(1))
        return Ran(self.answers.get(port, self.default))


@pytest.fixture
def cluster(load_small):
    return load_small()


POWERED_OFF = FakeHost({})  # nothing answers: every port "filtered"
FIREWALLED = FakeHost({22: 0})  # SSH open, everything else dropped


@pytest.mark.parametrize("port", [2379, 2380])
def test_worker_probe_fails_when_the_target_is_powered_off(cluster, port) -> None:
    with pytest.raises(ControlFailed, match="positive control failed"):
        from_workers.test_etcd_ports_are_filtered(POWERED_OFF, cluster, port)


@pytest.mark.parametrize("port", [2379, 2380])
def test_worker_probe_passes_when_the_target_is_up_and_the_port_dropped(cluster, port) -> None:
    from_workers.test_etcd_ports_are_filtered(FIREWALLED, cluster, port)


def test_control_plane_peer_probe_needs_the_control(cluster) -> None:
    with pytest.raises(ControlFailed):
        from_control_plane.test_etcd_peer_port_is_filtered(POWERED_OFF, cluster)
    from_control_plane.test_etcd_peer_port_is_filtered(FIREWALLED, cluster)


def test_control_follows_the_inventory_ssh_port(small_cluster, load_small) -> None:
    small_cluster["ssh"] = {"port": 2222}
    loaded = load_small()
    from_workers.test_etcd_ports_are_filtered(FakeHost({2222: 0}), loaded, 2379)
    with pytest.raises(ControlFailed):
        from_workers.test_etcd_ports_are_filtered(FakeHost({22: 0}), loaded, 2379)
