"""The GPU health manifests and node script render from the inventory and say what they must."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from engine.context import load
from engine.registry import ROLE_CONFIGS
from inventory.errors import InventoryInvalid
from roles import gpu_health
from roles.gpu_health.config import GpuHealthConfig
from roles.gpu_health.files import MANIFEST, cluster_files
from roles.gpu_health.sampling import cluster_sample
from toolkit.templates import render_template

SAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "sample"


def documents(loaded) -> dict[str, dict]:
    """The first object of each kind (one each but RBAC, which `objects` gives in full)."""
    docs: dict[str, dict] = {}
    for doc in objects(loaded):
        docs.setdefault(doc["kind"], doc)
    return docs


def objects(loaded) -> list[dict]:
    return list(yaml.safe_load_all(cluster_files(loaded)[MANIFEST]))


def named(loaded, kind: str, name: str) -> dict:
    return next(d for d in objects(loaded) if d["kind"] == kind and d["metadata"]["name"] == name)


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
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap",
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
    assert pod["serviceAccountName"] == "gpu-health-preflight"
    container = pod["containers"][0]
    assert container["command"][-1] == "preflight"
    # The DaemonSet must not hold GPUs that work needs.
    assert "limits" not in container["resources"]
    textfile = next(v for v in pod["volumes"] if v["name"] == "textfile")
    assert textfile["hostPath"]["path"] == GpuHealthConfig().textfile_dir
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["textfile"] == "/textfile"


def test_the_sampler_may_list_nodes_and_create_jobs_only():
    loaded = load(SAMPLE)
    assert named(loaded, "ClusterRole", "gpu-health-sampler")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
    ]
    role = named(loaded, "Role", "gpu-health-sampler")
    assert role["metadata"]["namespace"] == GpuHealthConfig().namespace
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]


@pytest.mark.parametrize("account", ["gpu-health-preflight", "gpu-health-periodic"])
def test_rbac_lets_each_pod_patch_nodes_their_status_and_create_events_only(account):
    loaded = load(SAMPLE)
    rules = named(loaded, "ClusterRole", account)["rules"]
    granted = {(res, verb) for r in rules for res in r["resources"] for verb in r["verbs"]}
    # nodes/status get: kubectl patch reads the subresource before it patches it (refused
    # without it by the lab's real API server).
    wanted = {
        ("nodes", "get"),
        ("nodes", "patch"),
        ("nodes/status", "get"),
        ("nodes/status", "patch"),
    }
    if account == "gpu-health-periodic":
        wanted.add(("nodes", "list"))  # counts the cordoned nodes against the budget
    assert granted == wanted
    binding = named(loaded, "ClusterRoleBinding", account)
    assert binding["subjects"][0]["name"] == account
    assert binding["roleRef"]["name"] == account
    events = named(loaded, "Role", f"{account}-events")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_cronjob_draws_nodes_and_each_check_job_takes_a_whole_node():
    docs = documents(load(SAMPLE))
    cron = docs["CronJob"]["spec"]
    cfg = GpuHealthConfig()
    assert cron["schedule"] == cfg.cronjob_schedule
    assert cron["concurrencyPolicy"] == "Forbid"
    sampler = cron["jobTemplate"]["spec"]["template"]["spec"]
    assert sampler["serviceAccountName"] == "gpu-health-sampler"
    assert sampler["containers"][0]["command"][:4] == [
        "python3",
        "-m",
        "gpuhealth.gate",
        "sample",
    ]
    per_run = cluster_sample(load(SAMPLE)).per_run
    assert f"--count={per_run}" in sampler["containers"][0]["command"]
    assert "limits" not in sampler["containers"][0]["resources"]  # the sampler holds no GPU
    job = yaml.safe_load(docs["ConfigMap"]["data"]["periodic-job.yaml"])
    assert job["kind"] == "Job" and job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-health-periodic"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert pod["containers"][0]["command"][-1] == "periodic"


def test_node_script_lifts_the_taint_only_after_passing(tmp_path):
    script = documents(load(SAMPLE))["ConfigMap"]["data"]["health-node.sh"]
    # The decision is Python's (gpuhealth/gate.py, tests/unit/test_gpu_health_gate.py).
    assert 'python3 -m gpuhealth.gate "$1"' in script
    assert "check --require-active" in script
    assert "--budget '10%'" in script
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
    assert "--budget '2'" in docs["ConfigMap"]["data"]["health-node.sh"]


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


def test_preflight_waits_for_the_api_and_its_verdict_reaches_it(tmp_path):
    """A health pod that started before kube-proxy had programmed the API's address on its
    new node read no taint, skipped the preflight for good, and the node never got its
    verdict's Event (CI of 327ad80's lab). The rendered script, with stand-ins for kubectl
    (fails twice, then shows the taint), the checks (a failed node), the gate (the API fails
    it once) and sleep (the passive loop's first sleep ends the run): the read is retried, the
    checks run, the gate is asked again until it is through. The control: a node without the
    taint goes straight to the passive loop."""
    script = documents(load(SAMPLE))["ConfigMap"]["data"]["health-node.sh"]
    (tmp_path / "health-node.sh").write_text(script)
    log, bin_dir = tmp_path / "log", tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "kubectl": 'n=$(cat "$T/reads" 2>/dev/null || echo 0); echo $((n + 1)) > "$T/reads"\n'
        'echo kubectl >> "$T/log"; [ "$n" -ge 2 ] || exit 1; echo "$TAINTS"',
        "gpuinfra": 'echo check >> "$T/log"; echo "{}"; exit 6',
        "python3": 'n=$(cat "$T/gates" 2>/dev/null || echo 0); echo $((n + 1)) > "$T/gates"\n'
        'echo "gate $3 $7" >> "$T/log"; [ "$n" -ge 1 ]',
        "sleep": 'echo "sleep $1" >> "$T/log"; [ "$1" = 5 ] || kill "$PPID"',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)

    def run(taints: str) -> list[str]:
        for leftover in ("log", "reads", "gates"):
            (tmp_path / leftover).unlink(missing_ok=True)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "T": str(tmp_path), "NODE_NAME": "gpu-1",
               "TAINTS": taints}  # fmt: skip
        subprocess.run(["sh", str(tmp_path / "health-node.sh"), "preflight"], env=env,
                       capture_output=True, timeout=30)  # fmt: skip
        return log.read_text().splitlines()

    taint = gpu_health.PREFLIGHT_TAINT_KEY
    assert run(f"other {taint}") == [
        "kubectl", "sleep 5", "kubectl", "sleep 5", "kubectl", "check",
        "gate preflight failed", "sleep 5", "gate preflight failed", "sleep 300",
    ]  # fmt: skip
    assert run("other") == ["kubectl", "sleep 5", "kubectl", "sleep 5", "kubectl", "sleep 300"]
