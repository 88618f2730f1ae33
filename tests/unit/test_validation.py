"""Each validation rule, fed a broken inventory through the CLI: exit 2 and one clear line."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from cli.main import app
from inventory.errors import InventoryInvalid
from tests.unit.conftest import SAMPLE

runner = CliRunner()


def validate(path) -> tuple[int, str]:
    result = runner.invoke(app, ["inventory", "validate", str(path)])
    return result.exit_code, result.stderr


def test_sample_inventory_is_valid(small_cluster):
    result = runner.invoke(app, ["inventory", "validate", str(SAMPLE)])
    assert result.exit_code == 0, result.output
    assert "28 hosts" in result.stdout


def test_small_cluster_is_valid(small_cluster, write_cluster):
    code, err = validate(write_cluster(small_cluster))
    assert (code, err) == (0, "")


def test_even_etcd_count(small_cluster, write_cluster):
    small_cluster["hosts"]["etcd-4"] = {"address": "10.0.0.14", "groups": ["etcd"]}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "cluster.yml" in err
    assert "hosts.etcd-4: etcd needs an odd number of members (got 4)" in err


def test_duplicate_host_name_is_caught_at_yaml_level(small_cluster, write_cluster):
    path = write_cluster(small_cluster)
    text = path.read_text().replace(
        "  cpu-1:\n", "  etcd-1:\n    address: 10.0.0.99\n    groups: [etcd]\n  cpu-1:\n"
    )
    path.write_text(text)
    code, err = validate(path)
    assert code == 2
    assert "hosts.etcd-1: duplicate key (first at line" in err


def test_duplicate_address(small_cluster, write_cluster):
    small_cluster["hosts"]["cpu-1"]["address"] = "10.0.0.11"
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "hosts.cpu-1.address: 10.0.0.11 is already the address of etcd-1" in err


def test_address_outside_node_network(small_cluster, write_cluster):
    small_cluster["hosts"]["cpu-1"]["address"] = "10.9.0.1"
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "hosts.cpu-1.address: 10.9.0.1 is outside the node network 10.0.0.0/24" in err


@pytest.mark.parametrize("which", ["pod", "service"])
def test_overlapping_networks(small_cluster, write_cluster, which):
    small_cluster["networks"][which] = "10.0.0.0/16"
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert f"networks.{which}: 10.0.0.0/16 overlaps networks.node (10.0.0.0/24)" in err


def test_pod_and_service_overlap(small_cluster, write_cluster):
    small_cluster["networks"].update(pod="10.96.0.0/12", service="10.96.0.0/16")
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "networks.service: 10.96.0.0/16 overlaps networks.pod" in err


def test_several_control_plane_nodes_without_a_loadbalancer_are_valid(small_cluster, write_cluster):
    """The kubernetes role balances on each node instead (tests/unit/test_role_kubernetes.py)."""
    del small_cluster["hosts"]["lb-1"]
    code, err = validate(write_cluster(small_cluster))
    assert code == 0, err


def test_two_loadbalancers_need_a_vip(small_cluster, write_cluster):
    small_cluster["hosts"]["lb-2"] = {"address": "10.0.0.32", "groups": ["loadbalancer"]}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "api.vip: 2 load balancers share a virtual address: set api.vip" in err


@pytest.mark.parametrize(
    ("where", "key"),
    [
        (lambda d: d["hosts"]["cpu-1"], "hosts.cpu-1.adress"),
        (lambda d: d["networks"], "networks.adress"),
        (lambda d: d, "adress"),
    ],
)
def test_unknown_keys_are_errors(small_cluster, write_cluster, where, key):
    where(small_cluster)["adress"] = "x"
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert f"{key}: unknown key" in err


def test_unknown_role_setting_is_an_error(small_cluster, write_cluster):
    small_cluster["group_vars"] = {"all": {"base": {"ntp_server": ["a"]}}}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "group_vars.all.base.ntp_server: unknown key" in err


def test_unknown_group_is_an_error(small_cluster, write_cluster):
    small_cluster["hosts"]["cpu-1"]["groups"] = ["kube_node"]
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "hosts.cpu-1.groups.0: must be one of" in err


def test_gpu_worker_without_gpu_spec(small_cluster, write_cluster):
    del small_cluster["hosts"]["gpu-1"]["gpu"]
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "hosts.gpu-1.gpu: gpu_worker hosts need a gpu spec (model and count)" in err


def test_unreadable_ssh_key(small_cluster, write_cluster):
    small_cluster["ssh"] = {"key": "missing_key"}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "ssh.key: cannot read" in err and "No such file or directory" in err


def test_ssh_key_readable_by_others(small_cluster, write_cluster, tmp_path):
    key = tmp_path / "inv" / "id_ed25519"
    key.parent.mkdir(exist_ok=True)
    key.write_text("not shown\n")
    os.chmod(key, 0o644)
    small_cluster["ssh"] = {"key": "id_ed25519"}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "is mode 0o644; a private key must be 0600" in err
    assert "not shown" not in err
    os.chmod(key, 0o600)
    assert validate(write_cluster(small_cluster))[0] == 0


def test_malformed_yaml_names_the_line(write_cluster, small_cluster):
    path = write_cluster(small_cluster)
    lines = path.read_text().splitlines()
    lines.insert(3, "networks: [unclosed")
    path.write_text("\n".join(lines))
    code, err = validate(path)
    assert code == 2
    assert "cluster.yml:" in err and "malformed YAML" in err
    line = int(err.split("cluster.yml:")[1].split(":")[0])
    assert line in (4, 5)


def test_errors_carry_line_numbers(small_cluster, write_cluster):
    small_cluster["hosts"]["cpu-1"]["address"] = "10.9.0.1"
    path = write_cluster(small_cluster)
    code, err = validate(path)
    expected = next(
        i for i, line in enumerate(path.read_text().splitlines(), 1) if "10.9.0.1" in line
    )
    assert f"cluster.yml:{expected}: hosts.cpu-1.address" in err


def test_all_problems_are_reported_at_once(small_cluster, write_cluster):
    small_cluster["hosts"]["etcd-4"] = {"address": "10.0.0.14", "groups": ["etcd"]}
    small_cluster["hosts"]["cpu-1"]["address"] = "10.9.0.1"
    _, err = validate(write_cluster(small_cluster))
    assert "odd number" in err and "outside the node network" in err


def test_no_traceback_unless_verbose(small_cluster, write_cluster):
    small_cluster["hosts"]["cpu-1"]["address"] = "10.9.0.1"
    path = write_cluster(small_cluster)
    quiet = runner.invoke(app, ["inventory", "validate", str(path)])
    assert "Traceback" not in quiet.stderr
    loud = runner.invoke(app, ["--verbose", "inventory", "validate", str(path)])
    assert loud.exit_code == 2
    assert "Traceback" in loud.stderr


def test_invalid_inventory_writes_nothing(small_cluster, write_cluster, tmp_path):
    small_cluster["hosts"]["cpu-1"]["address"] = "10.9.0.1"
    out = tmp_path / "render"
    result = runner.invoke(app, ["render", str(write_cluster(small_cluster)), "--out", str(out)])
    assert result.exit_code == 2
    assert not out.exists()


def test_loader_raises_with_every_error(small_cluster, load_small):
    small_cluster["hosts"]["etcd-4"] = {"address": "10.0.0.14", "groups": ["etcd"]}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    assert [e.key for e in excinfo.value.errors] == ["hosts.etcd-4"]


def test_group_and_host_settings_invalid_together_are_caught_at_validate(
    small_cluster, write_cluster
):
    """Each section alone is valid; merged for etcd-2 they break etcd's 5x election rule.
    Validated section by section this passed `inventory validate` and failed during prepare."""
    small_cluster["group_vars"] = {"etcd": {"etcd": {"heartbeat_interval_ms": 300}}}
    small_cluster["hosts"]["etcd-2"]["vars"] = {"etcd": {"election_timeout_ms": 1200}}
    path = write_cluster(small_cluster)
    code, err = validate(path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = path.read_text().splitlines().index("      etcd:") + 1
    assert lines[0].startswith(f"{path.name}:{line}: hosts.etcd-2.vars.etcd: ") or (
        f":{line}: hosts.etcd-2.vars.etcd: " in lines[0]
    ), err
    assert "election_timeout_ms must be at least 5x heartbeat_interval_ms" in lines[0]
    assert "group_vars.etcd.etcd + hosts.etcd-2.vars.etcd together" in lines[0]
    assert "Traceback" not in err


def test_a_merged_key_error_names_the_section_that_set_it(small_cluster, write_cluster):
    small_cluster["group_vars"] = {"all": {"etcd": {"health_timeout_s": 60}}}
    small_cluster["hosts"]["etcd-3"]["vars"] = {"etcd": {"health_timeout_s": 1}}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "hosts.etcd-3.vars.etcd.health_timeout_s: Input should be greater than or equal" in err
    assert "group_vars.all" not in err


def test_loaded_settings_are_typed_and_merged_in_order(small_cluster, load_small):
    from roles.etcd.config import EtcdConfig

    small_cluster["group_vars"] = {
        "all": {"etcd": {"health_timeout_s": 30, "backup_keep": 5}},
        "etcd": {"etcd": {"health_timeout_s": 40}},
    }
    small_cluster["hosts"]["etcd-1"]["vars"] = {"etcd": {"health_timeout_s": 50}}
    loaded = load_small()
    first, second = loaded.settings["etcd-1"]["etcd"], loaded.settings["etcd-2"]["etcd"]
    assert isinstance(first, EtcdConfig)
    assert (first.health_timeout_s, first.backup_keep) == (50, 5)
    assert (second.health_timeout_s, second.backup_keep) == (40, 5)


def test_the_group_literal_names_the_documented_groups_in_order():
    """`Group` (for type checkers and pydantic) and `GROUPS` (names and meanings) are one list."""
    from typing import get_args

    from inventory.model import GROUPS, Group

    assert get_args(Group) == tuple(GROUPS)
