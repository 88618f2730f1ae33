"""Importing Ansible inventories (Kubespray layout) through ansible-core's own loader."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli.main import app
from engine.context import load
from inventory.ansible_import import import_ansible

KUBESPRAY = Path(__file__).parent / "data" / "kubespray"
runner = CliRunner()


def test_kubespray_ini_maps_groups_and_host_vars():
    result = import_ansible(KUBESPRAY / "inventory.ini", name="mycluster")
    cluster = result.loaded.cluster
    assert cluster.in_group("control_plane") == ["node1", "node2"]
    assert cluster.in_group("etcd") == ["node1", "node2", "node3"]
    assert cluster.in_group("cpu_worker") == ["node4", "node5"]
    assert cluster.in_group("loadbalancer") == ["lb1"]
    # Kubespray binds to `ip`; ansible_host is only how the controller reaches a host.
    assert str(cluster.hosts["node1"].address) == "10.20.0.11"
    assert cluster.etcd_member("node1") == "etcd1"
    assert cluster.ssh.user == "ubuntu"  # from group_vars/all.yml
    assert cluster.domain == "mycluster.local"
    assert str(cluster.networks.pod) == "10.233.64.0/18"  # from group_vars/k8s_cluster/
    assert str(cluster.networks.service) == "10.233.0.0/18"
    assert cluster.versions.kubernetes == "1.35.4"
    assert str(cluster.networks.node) == "10.20.0.0/24"


def test_unmapped_variables_and_groups_are_reported():
    result = import_ansible(KUBESPRAY / "inventory.ini", name="mycluster")
    assert "variable node_labels (node5) has no gpuinfra equivalent" in result.unmapped
    assert "variable upstream_dns_servers (6 hosts) has no gpuinfra equivalent" in result.unmapped


def test_cli_import_writes_a_valid_cluster_file(tmp_path):
    out = tmp_path / "mycluster" / "cluster.yml"
    result = runner.invoke(
        app, ["inventory", "import", str(KUBESPRAY / "inventory.ini"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "not mapped: variable node_labels (node5)" in result.stdout
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "kubespray"
    assert len(load(out).cluster.hosts) == 6
    again = runner.invoke(
        app, ["inventory", "import", str(KUBESPRAY / "inventory.ini"), "--out", str(out)]
    )
    assert again.exit_code == 2 and "exists" in again.stderr


def test_an_imported_cluster_file_without_a_yaml_suffix_validates_as_one(tmp_path):
    """--out names the file as the operator likes; validate must read it back as the cluster
    file it is, not hand it to ansible-core as an INI inventory."""
    out = tmp_path / "mycluster"
    result = runner.invoke(
        app, ["inventory", "import", str(KUBESPRAY / "inventory.ini"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    validated = runner.invoke(app, ["inventory", "validate", str(out)])
    assert validated.exit_code == 0, validated.output
    assert validated.stdout == f"{out}: valid (6 hosts)\n"
    assert "WARNING" not in validated.stderr


def test_an_ini_inventory_without_a_suffix_is_still_ansible(tmp_path):
    """The control for the test above: a suffixless file that is not our mapping goes to
    ansible-core, which maps its groups."""
    path = tmp_path / "hosts-prod"
    path.write_text("[etcd]\nn1 ansible_host=10.1.0.1\n[kube_node]\nn2 ansible_host=10.1.0.2\n")
    loaded = load(path)
    assert loaded.cluster.in_group("etcd") == ["n1"]
    assert loaded.cluster.in_group("cpu_worker") == ["n2"]


def test_commands_accept_an_ansible_inventory_directly(tmp_path):
    result = runner.invoke(app, ["inventory", "validate", str(KUBESPRAY / "inventory.ini")])
    assert result.exit_code == 0, result.output
    rendered = runner.invoke(
        app, ["render", str(KUBESPRAY / "inventory.ini"), "--out", str(tmp_path / "r")]
    )
    assert rendered.exit_code == 0, rendered.output
    assert (tmp_path / "r" / "node1" / "etc" / "hosts").is_file()


def test_yaml_ansible_inventory_is_recognised(tmp_path):
    inventory = {
        "all": {
            "hosts": {"a1": {"ansible_host": "10.1.0.5"}, "a2": {"ansible_host": "10.1.0.6"}},
            "children": {
                "kube_control_plane": {"hosts": {"a1": None}},
                "etcd": {"hosts": {"a1": None}},
                "kube_node": {"hosts": {"a2": None}},
            },
        }
    }
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    loaded = load(path)
    assert loaded.cluster.in_group("cpu_worker") == ["a2"]
    assert loaded.cluster.in_group("control_plane") == ["a1"]


def test_an_invalid_import_names_the_rule(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("[etcd]\nn1 ansible_host=10.1.0.1\nn2 ansible_host=10.1.0.2\n")
    result = runner.invoke(app, ["inventory", "validate", str(path)])
    assert result.exit_code == 2
    assert "etcd needs an odd number of members (got 2)" in result.stderr


def test_import_without_admin_networks_starts_with_the_firewall_off():
    """Ansible inventories name no admin networks: a filtering firewall would shut the
    controller out, so the import turns it off and says how to turn it on."""
    result = import_ansible(KUBESPRAY / "inventory.ini", name="mycluster")
    assert result.data["group_vars"] == {"all": {"firewall": {"enabled": False}}}
    assert any(note.startswith("firewall disabled") for note in result.unmapped)
