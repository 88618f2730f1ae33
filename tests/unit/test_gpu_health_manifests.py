"""The GPU health manifests and node script render from the inventory and say what they must."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from inventory.errors import InventoryInvalid
from roles import gpu_health
from roles.context import load
from roles.gpu_health.config import GpuHealthConfig
from roles.gpu_health.files import MANIFEST, cluster_files
from roles.registry import ROLE_CONFIGS
from roles.templates import render_template

SAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "sample"


def documents(loaded) -> dict[str, dict]:
    text = cluster_files(loaded)[MANIFEST]
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text)}


def write_cluster(tmp_path: Path, group_vars: dict | None = None, workers: int = 3) -> Path:
    hosts = {
        f"gpu-{i}": {
            "address": f"10.0.0.{10 + i}",
            "groups": ["gpu_worker"],
            "gpu": {"model": "H100-SXM5-80GB", "count": 4 if i == 1 else 8},
        }
        for i in range(1, workers + 1)
    }
    data = {
        "name": "tiny",
        "domain": "tiny.test",
        "networks": {"node": "10.0.0.0/24", "admin": ["192.0.2.0/24"]},
        "hosts": hosts,
        "group_vars": group_vars or {},
    }
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_preflight_taint_constant():
    # The kubernetes role registers kubelet with exactly this string.
    assert gpu_health.PREFLIGHT_TAINT == "gpuinfra.io/preflight=true:NoSchedule"


def test_sample_cluster_manifests_are_valid_yaml_with_every_object():
    docs = documents(load(SAMPLE))
    assert set(docs) == {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
        "DaemonSet", "CronJob",
    }  # fmt: skip
    namespace = docs["Namespace"]["metadata"]["name"]
    for kind in ("ServiceAccount", "ConfigMap", "DaemonSet", "CronJob"):
        assert docs[kind]["metadata"]["namespace"] == namespace


def test_daemonset_tolerates_the_preflight_taint_and_exports_metrics():
    docs = documents(load(SAMPLE))
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert {
        "key": "gpuinfra.io/preflight", "operator": "Equal", "value": "true",
        "effect": "NoSchedule",
    } in pod["tolerations"]  # fmt: skip
    assert pod["nodeSelector"] == {gpu_health.GPU_WORKER_LABEL_KEY: "true"}
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    container = pod["containers"][0]
    assert container["command"][-1] == "preflight"
    # The DaemonSet must not hold GPUs that work needs.
    assert "limits" not in container["resources"]
    textfile = next(v for v in pod["volumes"] if v["name"] == "textfile")
    assert textfile["hostPath"]["path"] == GpuHealthConfig().textfile_dir
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["textfile"] == "/textfile"


def test_rbac_lets_the_pods_patch_nodes_and_their_status():
    docs = documents(load(SAMPLE))
    rules = docs["ClusterRole"]["rules"]
    assert any("nodes" in r["resources"] and "patch" in r["verbs"] for r in rules)
    assert any("nodes/status" in r["resources"] and "patch" in r["verbs"] for r in rules)
    subject = docs["ClusterRoleBinding"]["subjects"][0]
    assert subject["name"] == docs["ServiceAccount"]["metadata"]["name"]
    assert docs["ClusterRoleBinding"]["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]


def test_cronjob_takes_whole_idle_nodes_on_a_schedule():
    docs = documents(load(SAMPLE))
    cron = docs["CronJob"]["spec"]
    cfg = GpuHealthConfig()
    assert cron["schedule"] == cfg.cronjob_schedule
    assert cron["concurrencyPolicy"] == "Forbid"
    job = cron["jobTemplate"]["spec"]
    assert job["parallelism"] == cfg.cronjob_parallelism and job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert pod["containers"][0]["command"][-1] == "periodic"
    assert pod["affinity"]["podAntiAffinity"]


def test_node_script_lifts_the_taint_only_after_passing(tmp_path):
    script = documents(load(SAMPLE))["ConfigMap"]["data"]["health-node.sh"]
    assert "kubectl taint node \"$node\" 'gpuinfra.io/preflight:NoSchedule-'" in script
    assert "--require-active" in script
    # The sample has 8 GPU workers: 10% rounds down to 0, and the floor is 1.
    assert "-ge 1 ]" in script
    path = tmp_path / "health-node.sh"
    path.write_text(script)
    shell = shutil.which("sh")
    assert shell, "a POSIX shell is part of every Debian system"
    syntax = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_expectations_come_from_the_inventory(tmp_path):
    loaded = load(write_cluster(tmp_path, {"gpu_worker": {"gpu_health": {"dcgm_level": 2}}}))
    data = json.loads(documents(loaded)["ConfigMap"]["data"]["expect.json"])
    assert data["driver"] == loaded.cluster.versions.nvidia_driver
    assert data["hosts"]["gpu-1"] == {
        "count": 4, "model": "H100-SXM5-80GB", "config": {"dcgm_level": 2}
    }  # fmt: skip
    assert data["hosts"]["gpu-2"]["count"] == 8


def test_group_vars_override_defaults(tmp_path):
    overrides = {"cronjob_schedule": "5 3 * * *", "cordon_budget": "2", "namespace": "ops"}
    loaded = load(write_cluster(tmp_path, {"gpu_worker": {"gpu_health": overrides}}))
    docs = documents(loaded)
    assert docs["CronJob"]["spec"]["schedule"] == "5 3 * * *"
    assert docs["DaemonSet"]["metadata"]["namespace"] == "ops"
    assert "-ge 2 ]" in docs["ConfigMap"]["data"]["health-node.sh"]


def test_config_changes_roll_the_daemonset(tmp_path):
    first = documents(load(write_cluster(tmp_path)))
    again = documents(
        load(write_cluster(tmp_path, {"gpu_worker": {"gpu_health": {"dcgm_level": 3}}}))
    )

    def digest(docs):
        return docs["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]

    assert digest(first) != digest(again)


def test_unknown_gpu_health_settings_are_inventory_errors(tmp_path):
    assert ROLE_CONFIGS["gpu_health"] is GpuHealthConfig
    path = write_cluster(tmp_path, {"gpu_worker": {"gpu_health": {"matmul_sise": 4096}}})
    with pytest.raises(InventoryInvalid, match="matmul_sise"):
        load(path)


def test_no_gpu_workers_no_manifests(tmp_path):
    data = {
        "name": "cpu",
        "domain": "cpu.test",
        "networks": {"node": "10.0.0.0/24", "admin": ["192.0.2.0/24"]},
        "hosts": {"cpu-1": {"address": "10.0.0.5", "groups": ["cpu_worker"]}},
    }
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(data))
    assert cluster_files(load(path)) == {}


def test_templates_refuse_missing_variables():
    with pytest.raises(jinja2.UndefinedError):
        render_template("gpu_health/gpu-health.yaml.j2", cfg=GpuHealthConfig())
