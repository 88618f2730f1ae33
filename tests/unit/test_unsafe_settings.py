"""Settings production cannot carry (the lab's escapes) are refused at validate unless the
inventory takes them on purpose: kubelet on cgroup v1, kubeadm's data-protecting preflight
checks (or all of them) ignored, a registry mirror over plain HTTP."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.context import load
from inventory.errors import InventoryInvalid


def settings_of(small_cluster, role: str, settings: dict) -> dict:
    small_cluster.setdefault("group_vars", {}).setdefault("all", {})[role] = settings
    return small_cluster


REFUSED = [
    ("kubernetes", {"fail_cgroup_v1": False}, "cgroup v1"),
    ("kubernetes", {"ignore_preflight_errors": ["all"]}, "all would let kubeadm"),
    (
        "kubernetes",
        {"ignore_preflight_errors": ["SystemVerification", "DirAvailable--var-lib-etcd"]},
        "DirAvailable--var-lib-etcd would let kubeadm",
    ),
    (
        "kubernetes",
        {"ignore_preflight_errors": ["FileAvailable--etc-kubernetes-kubelet.conf"]},
        "FileAvailable--etc-kubernetes-kubelet.conf",
    ),
    (
        "container_runtime",
        {"registry_mirrors": {"docker.io": ["http://10.0.0.9:5000"]}},
        "http://10.0.0.9:5000 over plain HTTP",
    ),
]


@pytest.mark.parametrize(("role", "settings", "said"), REFUSED)
def test_an_escape_is_refused_naming_the_key(small_cluster, write_cluster, role, settings, said):
    path = write_cluster(settings_of(small_cluster, role, settings))
    with pytest.raises(InventoryInvalid) as raised:
        load(path)
    (error,) = raised.value.errors
    assert error.key.startswith(f"group_vars.all.{role}")
    assert said in error.message


ACCEPTED = [
    ("kubernetes", {"fail_cgroup_v1": False, "accept_unsafe": ["fail_cgroup_v1"]}),
    (
        "kubernetes",
        {"ignore_preflight_errors": ["all"], "accept_unsafe": ["ignore_preflight_errors"]},
    ),
    # A check that protects no data is an operator's call, as on the lab (the control).
    ("kubernetes", {"ignore_preflight_errors": ["SystemVerification"]}),
    (
        "container_runtime",
        {
            "registry_mirrors": {"docker.io": ["http://10.0.0.9:5000"]},
            "allow_insecure_registries": True,
        },
    ),
    ("container_runtime", {"registry_mirrors": {"docker.io": ["https://mirror.example"]}}),
]


@pytest.mark.parametrize(("role", "settings"), ACCEPTED)
def test_an_escape_taken_on_purpose_or_a_safe_setting_validates(
    small_cluster, write_cluster, role, settings
):
    load(write_cluster(settings_of(small_cluster, role, settings)))


def test_validate_exits_2_with_one_line_naming_the_file_and_key(small_cluster, write_cluster):
    path = write_cluster(settings_of(small_cluster, "kubernetes", {"fail_cgroup_v1": False}))
    result = CliRunner().invoke(app, ["inventory", "validate", str(path)])
    assert result.exit_code == 2
    assert str(path) in result.stderr
    assert "group_vars.all.kubernetes.fail_cgroup_v1" in result.stderr
    assert "accept_unsafe: [fail_cgroup_v1]" in result.stderr
    assert "Traceback" not in result.output
