"""The loadbalancer role on lab hosts: HAProxy in front of the control plane on the default lab
(one balancer), and keepalived moving the API's virtual address on a small lab of two.

Nothing serves the API on the control-plane nodes yet (Kubernetes comes later), so HAProxy
correctly marks every backend DOWN; to see a backend go UP and a connection reach it, a test
starts a throwaway HTTPS server on cp-1 in place of kube-apiserver, answering the /readyz
checks (and removes it after).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Iterator

import pytest

from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.topology import HostSpec, Topology
from tests.helpers import gpuinfra
from tests.integration.conftest import KEEP_ENV, LAB_NAME, LabCluster, boot_lab
from tests.integration.roles_helpers import (
    STANDIN_APISERVER,
    ask_https,
    eventually,
    install_standin_cert,
)

SOCKET = "/run/haproxy/admin.sock"
# The stand-in kube-apiserver's unit (roles_helpers.STANDIN_APISERVER).
LISTENER_UNIT = "gpuinfra-test-apiserver"
# The HA lab: two balancers sharing api.vip in front of two API servers (and the one etcd
# member an inventory with a control plane needs).
HA_LAB = f"{LAB_NAME}2"
HA_TOPOLOGY = Topology(
    (
        HostSpec("etcd-1", ("etcd",)),
        HostSpec("cp-1", ("control_plane",)),
        HostSpec("cp-2", ("control_plane",)),
        HostSpec("lb-1", ("loadbalancer",)),
        HostSpec("lb-2", ("loadbalancer",)),
    ),
    "lbmon-ha",
    needs_vip=True,
)

pytestmark = pytest.mark.integration


def apply_roles(lab: LabCluster, roles: str) -> None:
    result = gpuinfra(
        "apply", str(lab.inventory_path), "--roles", roles, "--yes", "--format", "json"
    )
    assert result.returncode == ExitCode.OK, result.stdout[-4000:] + result.stderr[-3000:]


def pending_changes(lab: LabCluster, roles: str) -> dict[str, list[str]]:
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", roles, "--format", "json")
    # A plan exits 3 (drift) exactly when something would change.
    assert result.returncode in (ExitCode.OK, ExitCode.DRIFT), result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert len(report["hosts"]) == len(lab.hosts)
    pending = {
        name: [op["name"] for op in host["operations"] if op["changed"]]
        for name, host in report["hosts"].items()
        if any(op["changed"] for op in host["operations"])
    }
    assert (result.returncode == ExitCode.DRIFT) == bool(pending), result.stdout[-3000:]
    return pending


def server_status(lab: LabCluster, balancer: str) -> dict[str, str]:
    """{server: status} of the kube-apiserver backend, from HAProxy's runtime API."""
    out = lab.ssh(balancer, f'echo "show stat" | socat stdio {SOCKET}').stdout
    header = out.splitlines()[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in out.splitlines()[1:]]
    return {
        row["svname"]: row["status"]
        for row in rows
        if row.get("pxname") == "kube-apiserver" and row["svname"] not in ("BACKEND", "FRONTEND")
    }


def test_plan_after_apply_has_no_changes(converged):
    assert pending_changes(converged, "base,loadbalancer,monitoring") == {}


def test_haproxy_runs_and_its_live_config_passes_the_check(converged):
    lab = converged
    assert lab.ssh("lb-1", "systemctl is-active haproxy").stdout.strip() == "active"
    lab.ssh("lb-1", "haproxy -c -f /etc/haproxy/haproxy.cfg")
    listening = lab.ssh("lb-1", "ss -Htln").stdout
    assert ":6443 " in listening and ":8404 " in listening


def test_every_control_plane_node_is_a_backend_marked_down_without_an_api(converged):
    lab = converged
    control_plane = lab.loaded.cluster.in_group("control_plane")
    statuses = eventually(
        lambda: (s := server_status(lab, "lb-1")) and all(v == "DOWN" for v in s.values()) and s,
        "every backend DOWN",
    )
    assert sorted(statuses) == sorted(control_plane)


def test_a_listening_backend_goes_up_and_receives_connections(converged):
    lab = converged
    port = lab.loaded.cluster.api.port
    install_standin_cert(lab, "cp-1")
    listener = f"python3 -c {shlex.quote(STANDIN_APISERVER)} {port}"
    lab.ssh("cp-1", f"systemd-run --unit={LISTENER_UNIT} {listener}")
    try:
        eventually(lambda: server_status(lab, "lb-1").get("cp-1") == "UP", "cp-1 UP")
        assert server_status(lab, "lb-1")["cp-2"] == "DOWN"
        # Through the balancer from another host: only cp-1 is UP, so it must answer.
        ask = ask_https(f"https://{lab.address('lb-1')}:{port}/hostname", attempts=5)
        reply = lab.ssh("mon-1", f"python3 -c {shlex.quote(ask)}").stdout.strip()
        assert reply == "cp-1"
    finally:
        lab.ssh("cp-1", f"systemctl stop {LISTENER_UNIT}", check=False)
    eventually(lambda: server_status(lab, "lb-1").get("cp-1") == "DOWN", "cp-1 DOWN again")


def test_prometheus_metrics_on_the_stats_port(converged):
    metrics = converged.ssh("lb-1", "curl -fsS http://127.0.0.1:8404/metrics").stdout
    assert 'haproxy_backend_active_servers{proxy="kube-apiserver"}' in metrics


def stats_answer(lab: LabCluster, balancer: str) -> bool:
    probe = "curl -fsS -o /dev/null --max-time 3 http://127.0.0.1:8404/stats"
    return lab.ssh(balancer, probe, check=False).returncode == 0


def test_a_failed_reload_is_repaired_by_the_next_apply(converged):
    """A reload that HAProxy cannot complete (here: a maxconn needing more descriptors than the
    kernel allows) keeps the old workers and tells systemd "Reload failed!", while the unit
    stays active. The file is then put back by hand, so only the role's serving check can see
    that the live configuration may not be the file's."""
    lab = converged
    config = "/etc/haproxy/haproxy.cfg"
    lab.ssh("lb-1", f"cp {config} /root/haproxy.cfg.good")
    lab.ssh("lb-1", f"sed -i 's/^    maxconn .*/    maxconn 1000000/' {config}")
    lab.ssh("lb-1", "systemctl reload haproxy", check=False)
    lab.ssh("lb-1", f"cp /root/haproxy.cfg.good {config}")
    status = "systemctl show --property=StatusText --value haproxy"
    eventually(
        lambda: lab.ssh("lb-1", status).stdout.strip() == "Reload failed!", "a failed reload"
    )
    assert lab.ssh("lb-1", "systemctl is-active haproxy").stdout.strip() == "active"
    assert pending_changes(lab, "loadbalancer") == {
        "lb-1": ["Load balancer | Restart HAProxy if it does not serve"]
    }
    apply_roles(lab, "loadbalancer")
    assert stats_answer(lab, "lb-1")
    assert lab.ssh("lb-1", status).stdout.strip() == "Ready."
    assert pending_changes(lab, "loadbalancer") == {}


def test_no_keepalived_with_one_balancer(converged):
    result = converged.ssh("lb-1", "test -e /etc/keepalived/keepalived.conf", check=False)
    assert result.returncode == 1


# --- two balancers: keepalived ---------------------------------------------------------------


@pytest.fixture(scope="module")
def ha_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    """A 5-host lab of its own (two balancers, two API servers), converged with base and
    loadbalancer; taken down after the module unless GPUINFRA_LAB_KEEP=1."""
    inventory = tmp_path_factory.mktemp("ha-lab") / "cluster.yml"
    lab = boot_lab(HA_LAB, HA_TOPOLOGY, inventory)
    try:
        apply_roles(lab, "base,loadbalancer")
        yield lab
    finally:
        if os.environ.get(KEEP_ENV) != "1":
            lifecycle.down(HA_LAB)


def vip_holders(lab: LabCluster) -> list[str]:
    vip = str(lab.loaded.cluster.api.vip)
    return [
        name
        for name in ("lb-1", "lb-2")
        if f"inet {vip}/" in lab.ssh(name, "ip -4 -o addr show dev eth0", check=False).stdout
    ]


def held_by(lab: LabCluster, balancer: str) -> Callable[[], bool]:
    return lambda: vip_holders(lab) == [balancer]


def test_ha_plan_after_apply_has_no_changes(ha_lab):
    assert pending_changes(ha_lab, "base,loadbalancer") == {}


def test_the_first_balancer_holds_the_vip_and_serves_through_it(ha_lab):
    lab = ha_lab
    eventually(held_by(lab, "lb-1"), "VIP on lb-1")
    vip, port = lab.loaded.cluster.api.vip, lab.loaded.cluster.api.port
    # HAProxy accepts on the VIP (every backend is DOWN, so it then closes the connection).
    lab.ssh("cp-1", f"timeout 5 bash -c '</dev/tcp/{vip}/{port}'")


def test_vip_moves_when_haproxy_stops_and_comes_back(ha_lab):
    lab = ha_lab
    eventually(held_by(lab, "lb-1"), "VIP on lb-1")
    lab.ssh("lb-1", "systemctl stop haproxy")
    try:
        eventually(held_by(lab, "lb-2"), "VIP on lb-2 after haproxy stopped on lb-1")
    finally:
        lab.ssh("lb-1", "systemctl start haproxy")
    eventually(held_by(lab, "lb-1"), "VIP back on lb-1 (higher priority)")


def test_vip_moves_when_keepalived_stops(ha_lab):
    lab = ha_lab
    eventually(held_by(lab, "lb-1"), "VIP on lb-1")
    lab.ssh("lb-1", "systemctl stop keepalived")
    try:
        eventually(held_by(lab, "lb-2"), "VIP on lb-2 after keepalived stopped on lb-1")
    finally:
        lab.ssh("lb-1", "systemctl start keepalived")
    eventually(held_by(lab, "lb-1"), "VIP back on lb-1")


def test_vip_moves_when_the_holder_is_powered_off(ha_lab):
    lab = ha_lab
    eventually(held_by(lab, "lb-1"), "VIP on lb-1")
    stop = gpuinfra("lab", "stop", "lb-1", "--name", lab.name)
    assert stop.returncode == 0, stop.stderr
    try:
        eventually(lambda: "lb-2" in vip_holders(lab), "VIP on lb-2 with lb-1 off")
    finally:
        start = gpuinfra("lab", "start", "lb-1", "--name", lab.name)
        assert start.returncode == 0, start.stderr
    eventually(held_by(lab, "lb-1"), "VIP back on lb-1 after it booted", seconds=120)
