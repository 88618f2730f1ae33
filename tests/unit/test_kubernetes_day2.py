"""Day-2 kubernetes operations offline: the order of steps (a recording runner stands in for
SSH), one-minor upgrade steps, batch sizes within the budget, refusals, and the CLI's errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from day2 import kubernetes as day2
from toolkit.remote import RemoteResult


@pytest.fixture
def loaded(small_cluster, load_small):
    small_cluster["hosts"]["cp-3"] = {"address": "10.0.0.23", "groups": ["control_plane"]}
    for i in (2, 3, 4):
        small_cluster["hosts"][f"cpu-{i}"] = {"address": f"10.0.0.7{i}", "groups": ["cpu_worker"]}
    return load_small()


class Recorder:
    def __init__(self, fail_on: str | None = None, node: str = "cpu-2 "):
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on
        self.node = node  # what `get node` prints: name and spec.unschedulable

    def __call__(self, loaded, host, command, timeout):
        self.calls.append((host, command))
        if self.fail_on and self.fail_on in command:
            return RemoteResult(host, 1, "", "boom")
        if "get nodes" in command:
            return RemoteResult(host, 0, '{"items": []}')
        return RemoteResult(host, 0, self.node if "get node " in command else "")


def actions(outcome) -> list[tuple[str, str]]:
    return [(step.host, step.action) for step in outcome.steps]


def test_upgrade_order_first_then_control_plane_one_by_one_then_worker_batches(loaded):
    outcome = day2.upgrade(loaded, "1.36.0", budget_percent=40, runner=Recorder())
    steps = actions(outcome)
    applies = [i for i, (h, a) in enumerate(steps) if a == "kubeadm upgrade apply"]
    assert [steps[i][0] for i in applies] == ["cp-1"]
    nodes = [(h, i) for i, (h, a) in enumerate(steps) if a == "kubeadm upgrade node"]
    assert [h for h, _ in nodes] == ["cp-2", "cp-3", "gpu-1", "cpu-1", "cpu-2", "cpu-3", "cpu-4"]
    assert applies[0] < nodes[0][1]
    # cp-2 is healthy again before cp-3 starts.
    cp2_health = steps.index(("cp-2", "wait for /healthz"))
    assert cp2_health < dict(nodes)["cp-3"]
    # Five workers at 40%: batches of two; a batch is drained before any of it is upgraded, and
    # uncordoned before the next batch is drained.
    drains = [i for i, (h, a) in enumerate(steps) if a.startswith("drain ")]
    uncordons = [i for i, (h, a) in enumerate(steps) if a.startswith("uncordon ")]
    assert [steps[i][1] for i in drains] == [
        "drain gpu-1",
        "drain cpu-1",
        "drain cpu-2",
        "drain cpu-3",
        "drain cpu-4",
    ]
    assert drains[1] < dict(nodes)["gpu-1"] and uncordons[1] < drains[2]
    assert all(steps[i][0] == "cp-1" for i in drains + uncordons)
    assert "versions.kubernetes: 1.36.0" in outcome.notes[0]


def test_upgrade_stops_at_the_first_failing_node(loaded):
    runner = Recorder(fail_on="kubeadm upgrade node")
    with pytest.raises(day2.KubernetesOperationError, match="cp-2: kubeadm upgrade node failed"):
        day2.upgrade(loaded, "1.36.0", runner=runner)
    assert not any(host == "cp-3" for host, _ in runner.calls)


@pytest.mark.parametrize(
    ("current", "target", "ok"),
    [
        ("1.31.4", "1.32.0", True),
        ("1.31.4", "1.31.6", True),
        ("1.31.4", "1.33.0", False),
        ("1.31.4", "1.30.9", False),
        ("1.31.4", "1.31.4", False),
        ("1.31.4", "2.0.0", False),
        ("1.31.4", "1.32", False),
    ],
)
def test_one_minor_at_a_time(current, target, ok):
    if ok:
        day2.check_upgrade_step(current, target)
    else:
        with pytest.raises(day2.KubernetesOperationError):
            day2.check_upgrade_step(current, target)


def test_batch_size_stays_within_the_budget():
    assert day2.batch_size(10, 20) == 2
    assert day2.batch_size(3, 20) == 1  # never zero
    assert day2.batch_size(1000, 5) == 50


def test_node_remove_order_and_refusals(loaded):
    runner = Recorder()
    outcome = day2.remove_node(loaded, "cpu-2", runner=runner)
    assert actions(outcome) == [
        ("cp-1", "read cpu-2"),
        ("cp-1", "cordon cpu-2"),
        ("cp-1", "drain cpu-2"),
        ("cp-1", "delete node cpu-2"),
        ("cpu-2", "kubeadm reset"),
    ]
    drain = runner.calls[2][1]
    assert "--ignore-daemonsets" in drain and "--force" not in drain
    forced = Recorder()
    day2.remove_node(loaded, "cpu-2", force=True, runner=forced)
    assert forced.calls[2][1].endswith(" --force")
    with pytest.raises(day2.KubernetesOperationError, match="first control-plane node"):
        day2.remove_node(loaded, "cp-1", runner=Recorder())
    with pytest.raises(day2.KubernetesOperationError, match="no host"):
        day2.remove_node(loaded, "nope", runner=Recorder())


def test_a_failed_drain_uncordons_a_node_that_was_schedulable(loaded):
    """Seen on the lab: a bare pod stops the drain; the node must not stay cordoned."""
    runner = Recorder(fail_on="drain")
    with pytest.raises(day2.KubernetesOperationError, match="cpu-2 is in the cluster, schedulable"):
        day2.remove_node(loaded, "cpu-2", runner=runner)
    assert runner.calls[-1] == ("cp-1", f"{day2.KUBECTL} uncordon cpu-2")
    assert not any("delete node" in command or "reset" in command for _, command in runner.calls)
    # A node the operator had cordoned before stays cordoned.
    cordoned = Recorder(fail_on="drain", node="cpu-2 true")
    with pytest.raises(day2.KubernetesOperationError):
        day2.remove_node(loaded, "cpu-2", runner=cordoned)
    assert not any("uncordon" in command for _, command in cordoned.calls)


def test_a_node_already_deleted_is_only_reset(loaded):
    runner = Recorder(node="")
    outcome = day2.remove_node(loaded, "cpu-2", runner=runner)
    assert actions(outcome) == [("cp-1", "read cpu-2"), ("cpu-2", "kubeadm reset")]


def test_a_restart_waits_for_the_pods_to_stop_and_for_this_api_server():
    """Through the balancer another API server answers at once: the wait names 127.0.0.1."""

    def restarting(runner):
        return day2.KubernetesRun(None, runner, day2.Outcome("restart"))

    runner = Recorder()
    job = restarting(runner)
    day2.restart_control_plane(job, "cp-2")
    assert actions(job.outcome) == [
        ("cp-2", "stop the control-plane pods"),
        ("cp-2", "wait for the pods to stop"),
        ("cp-2", "start the control-plane pods"),
        ("cp-2", "wait for /healthz"),
    ]
    commands = [command for _, command in runner.calls]
    assert "sport = :6443" in commands[1] and "--server https://127.0.0.1:6443" in commands[3]
    stuck = Recorder(fail_on="ss -ltnH")
    with pytest.raises(day2.KubernetesOperationError, match="did not stop"):
        day2.restart_control_plane(restarting(stuck), "cp-2")
    assert any("mv /etc/kubernetes/manifests.gpuinfra-away" in c for _, c in stuck.calls)


def test_certificate_renewal_rolls_over_the_control_plane(loaded):
    outcome = day2.renew_certificates(loaded, runner=Recorder())
    steps = actions(outcome)
    assert steps[0] == ("cp-1", "check certificate expiry")
    renewals = [h for h, a in steps if a == "renew certificates"]
    assert renewals == ["cp-1", "cp-2", "cp-3"]
    assert steps.index(("cp-1", "wait for /healthz")) < steps.index(("cp-2", "renew certificates"))


def test_parse_nodes_reads_readiness_versions_and_taints():
    text = (
        '{"items": [{"metadata": {"name": "gpu-1"}, "spec": {"taints": [{"key": '
        '"gpuinfra.io/preflight", "value": "true", "effect": "NoSchedule"}]}, "status": '
        '{"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": '
        '"v1.31.4"}}}]}'
    )
    (node,) = day2.parse_nodes(text)
    assert node.ready and node.version == "v1.31.4"
    assert node.taints == ["gpuinfra.io/preflight=true:NoSchedule"]


def test_cli_refuses_a_skipped_minor_with_one_line(loaded):
    result = CliRunner().invoke(
        app, ["kubernetes", "upgrade", str(loaded.source), "1.37.0", "--yes"]
    )
    assert result.exit_code == 1
    assert "one minor version at a time" in result.stderr
    assert "Traceback" not in result.output


def test_every_node_upgrade_passes_the_patches_directory(loaded):
    """kubeadm keeps no patches in the cluster: each node's upgrade names the directory again,
    so kubeadm applies the node's kubelet patch to the kubelet configuration it writes. Without
    it a worker's reserved resources, eviction and max pods reverted to the cluster's."""
    runner = Recorder()
    day2.upgrade(loaded, "1.36.0", budget_percent=40, runner=runner)
    upgrades = {
        host: command for host, command in runner.calls if command.startswith("kubeadm upgrade ")
    }
    patches = "--patches /etc/kubernetes/gpuinfra/patches"
    assert upgrades["cp-1"] == f"kubeadm upgrade apply v1.36.0 -y {patches}"
    assert upgrades["cp-2"] == upgrades["cp-3"] == f"kubeadm upgrade node {patches}"
    assert upgrades["cpu-1"] == upgrades["cpu-4"] == f"kubeadm upgrade node {patches}"


def test_upgrade_stores_the_targets_cluster_configuration_before_kubeadm_reads_it(loaded):
    recorder = Recorder()
    outcome = day2.upgrade(loaded, "1.36.3", runner=recorder)
    steps = actions(outcome)
    stored = steps.index(("cp-1", "store the target's ClusterConfiguration in kubeadm-config"))
    assert stored < steps.index(("cp-1", "plan the upgrade"))
    document = day2.target_cluster_configuration(loaded, "v1.36.3")
    # 1.36 serves gang scheduling's Workload API at v1alpha2 only: 1.35's v1alpha1 would stop
    # the new API server from starting.
    assert "scheduling.k8s.io/v1alpha2=true" in document
    assert "v1alpha1" not in document
    assert "kubernetesVersion: v1.36.3" in document
    command = recorder.calls[stored][1]
    assert "patch configmap kubeadm-config --type merge" in command


def test_upgrade_with_release_binaries_checks_each_against_the_targets_pin(
    small_cluster, load_small
):
    pins = {"kubeadm": "a" * 64, "kubelet": "b" * 64, "kubectl": "c" * 64}
    small_cluster["group_vars"] = {
        "all": {
            "kubernetes": {
                "source": "binaries",
                "binaries_url": "http://files:3144/kubernetes/release",
                "binary_sha256": {n: "0" * 64 for n in (*pins, "cni-plugins", "crictl")},
                "release_sha256": {"1.36.3": pins},
            }
        }
    }
    loaded = load_small()
    command = day2.package_commands(loaded, "cp-1", "v1.36.3", ["kubelet", "kubectl"])
    parts = command.split(" && ")
    fetch = parts.index(
        "curl -fsSL --retry 3 -o /var/tmp/gpuinfra-kubelet-download "
        "http://files:3144/kubernetes/release/v1.36.3/bin/linux/amd64/kubelet"
    )
    assert pins["kubelet"] in parts[fetch + 1] and "sha256sum -c" in parts[fetch + 1]
    assert parts[fetch + 2].startswith("install -m 0755 /var/tmp/gpuinfra-kubelet-download ")
    assert "/usr/local/bin/kubectl" in command
    with pytest.raises(day2.KubernetesOperationError, match=r"release_sha256\.1\.37\.0"):
        day2.package_commands(loaded, "cp-1", "v1.37.0", ["kubeadm"])


def test_a_pinned_coredns_is_left_to_the_inventory_during_an_upgrade(
    small_cluster, load_small, loaded
):
    """kubeadm's Corefile migration refuses a CoreDNS it does not know (1.36 on 1.14.7): with
    the inventory's own tag, its checks are ignored and its addon phase skipped."""
    plain = Recorder()
    day2.upgrade(loaded, "1.36.3", runner=plain)
    assert not any("CoreDNS" in c or "addon/coredns" in c for _, c in plain.calls)  # control
    small_cluster["group_vars"] = {"all": {"kubernetes": {"coredns_image_tag": "v1.14.7"}}}
    pinned, recorder = load_small(), Recorder()
    outcome = day2.upgrade(pinned, "1.36.3", runner=recorder)
    commands = dict(recorder.calls[i][::-1] for i in range(len(recorder.calls)))
    ignored = "--ignore-preflight-errors=CoreDNSUnsupportedPlugins,CoreDNSMigration"
    plan = next(c for c in commands if c.startswith("kubeadm upgrade plan"))
    apply = next(c for c in commands if c.startswith("kubeadm upgrade apply"))
    assert ignored in plan and ignored in apply and "--skip-phases addon/coredns" in apply
    nodes = [(h, c) for c, h in commands.items() if c.startswith("kubeadm upgrade node")]
    assert all(("addon/coredns" in c) == (h.startswith("cp-")) for h, c in nodes), nodes
    assert any("CoreDNS stays at v1.14.7" in note for note in outcome.notes)


def test_the_inventorys_ignored_preflight_checks_hold_for_the_upgrade_too(
    small_cluster, load_small
):
    """The lab's cgroup v1 hosts fail kubeadm's SystemVerification at init, join and upgrade
    alike: the inventory's list reaches every kubeadm upgrade command."""
    kubernetes = {"ignore_preflight_errors": ["SystemVerification"]}
    small_cluster["group_vars"] = {"all": {"kubernetes": kubernetes}}
    recorder = Recorder()
    day2.upgrade(load_small(), "1.36.3", runner=recorder)
    upgrades = [c for _, c in recorder.calls if c.startswith("kubeadm upgrade")]
    assert len(upgrades) >= 4
    assert all("--ignore-preflight-errors=SystemVerification" in c for c in upgrades), upgrades


def test_each_node_is_ready_at_the_new_version_before_it_is_uncordoned(loaded):
    outcome = day2.upgrade(loaded, "1.36.0", budget_percent=40, runner=Recorder())
    steps = actions(outcome)
    for host in ("cp-1", "cp-2", "cp-3", "cpu-1", "cpu-2", "cpu-3", "cpu-4"):
        restarted = steps.index((host, "restart kubelet"))
        ready = steps.index(("cp-1", f"wait for {host} Ready at v1.36.0"))
        # A control-plane node's static pods come back and its API server answers first.
        between = [] if host.startswith("cpu") else [
            (host, "start the control-plane pods"), (host, "wait for /healthz"),
        ]  # fmt: skip
        assert steps[restarted + 1 : ready] == between, host
    for host in ("cpu-1", "cpu-2"):
        assert steps.index(("cp-1", f"wait for {host} Ready at v1.36.0")) < steps.index(
            ("cp-1", f"uncordon {host}")
        )
    # The next batch (of two, at 40% of five workers) is drained only once this one is Ready
    # and uncordoned.
    moves = "".join(a[0] for _, a in steps if a.startswith(("drain ", "uncordon ")))
    assert moves == "dduudduudu"


def test_a_control_plane_kubelet_is_upgraded_with_its_static_pods_stopped(loaded):
    """The new kubelet took the old one's running API server for an orphan and killed it
    without its shutdown delay (Forbidden and EOF through the balancer, on the lab): each
    control-plane node's pods stop through kubelet first and start once it restarted; a
    worker's kubelet restarts as it is (no static pods; drained before)."""
    steps = actions(day2.upgrade(loaded, "1.36.0", runner=Recorder()))
    for host in ("cp-1", "cp-2", "cp-3"):
        at = steps.index((host, "upgrade kubelet and kubectl"))
        assert steps[at - 2 : at + 4] == [
            (host, "stop the control-plane pods"),
            (host, "wait for the pods to stop"),
            (host, "upgrade kubelet and kubectl"),
            (host, "restart kubelet"),
            (host, "start the control-plane pods"),
            (host, "wait for /healthz"),
        ], host
    # Control: no worker has its pods stopped.
    assert not [h for h, a in steps if a == "stop the control-plane pods" and h.startswith("cpu")]
    assert ("cpu-1", "restart kubelet") in steps
    # Pods that did not stop: no new kubelet, the manifests back, the upgrade stops there,
    # and kubeadm-config, which apply has moved on, is left as apply wrote it.
    stuck = Recorder(fail_on="ss -ltnH")
    with pytest.raises(day2.KubernetesOperationError, match="cp-1: kubelet did not stop") as raised:
        day2.upgrade(loaded, "1.36.0", runner=stuck)
    assert "kubeadm upgrade apply finished: cp-1's control plane runs v1.36.0" in str(raised.value)
    commands = [c for h, c in stuck.calls if h == "cp-1"]
    assert not any("systemctl restart kubelet" in c for c in commands)
    assert "mv /etc/kubernetes/manifests.gpuinfra-away" in commands[-1]
    assert not any(f"{day2.SAVED_CONFIGURATION}.json" in c for c in commands)


def test_a_node_not_ready_after_its_kubelet_restart_stops_the_upgrade_saying_what_it_reports(
    loaded,
):
    runner = Recorder(fail_on="= 'v1.36.0 True'", node="v1.35.4 False")
    with pytest.raises(day2.KubernetesOperationError) as raised:
        day2.upgrade(loaded, "1.36.0", runner=runner)
    message = str(raised.value)
    assert "cp-1: not Ready at v1.36.0" in message
    assert "(it reports: v1.35.4 False)" in message
    assert not [c for h, c in runner.calls if h == "cp-2"]


def test_a_failed_plan_puts_kubeadm_config_back(loaded):
    runner = Recorder(fail_on="kubeadm upgrade plan")
    with pytest.raises(day2.KubernetesOperationError) as raised:
        day2.upgrade(loaded, "1.36.0", runner=runner)
    assert "kube-system/kubeadm-config was put back as it was" in str(raised.value)
    commands = [c for _, c in runner.calls]
    saved = next(i for i, c in enumerate(commands) if day2.SAVED_CONFIGURATION in c)
    stored = next(i for i, c in enumerate(commands) if "upgrade-v1.36.0-cluster" in c)
    restored = next(i for i, c in enumerate(commands) if f"{day2.SAVED_CONFIGURATION}.json" in c)
    assert saved < stored < restored == len(commands) - 1


def test_a_failed_apply_says_exactly_what_changed(loaded):
    runner = Recorder(fail_on="kubeadm upgrade apply")
    with pytest.raises(day2.KubernetesOperationError) as raised:
        day2.upgrade(loaded, "1.36.0", runner=runner)
    message = str(raised.value)
    assert "kube-system/kubeadm-config holds v1.36.0's ClusterConfiguration" in message
    assert day2.SAVED_CONFIGURATION in message
    assert not any(f"{day2.SAVED_CONFIGURATION}.json" in c for _, c in runner.calls)


def test_an_upgrade_needing_a_newer_runtime_than_a_node_runs_is_refused_before_any_change(
    loaded,
):
    """Kubernetes 1.36 needs containerd 2: a node on 1.7 stops the upgrade before kubeadm is
    installed anywhere; the same nodes on 2.2 go ahead (the control)."""

    def nodes(runtime: str) -> str:
        items = [
            {"metadata": {"name": name}, "status": {"nodeInfo": {"containerRuntimeVersion": r}}}
            for name, r in (("cp-1", "containerd://2.2.9"), ("cpu-1", runtime))
        ]
        return json.dumps({"items": items})

    class Runtimes(Recorder):
        def __init__(self, runtime: str):
            super().__init__()
            self.answer = nodes(runtime)

        def __call__(self, loaded, host, command, timeout):
            if "get nodes -o json" in command:
                self.calls.append((host, command))
                return RemoteResult(host, 0, self.answer)
            return super().__call__(loaded, host, command, timeout)

    old = Runtimes("containerd://1.7.24")
    with pytest.raises(day2.KubernetesOperationError) as raised:
        day2.upgrade(loaded, "1.36.0", runner=old)
    assert "refused before any change" in str(raised.value)
    assert "containerd 2.0.0 or newer" in str(raised.value)
    assert "cpu-1 (containerd://1.7.24)" in str(raised.value)
    assert len(old.calls) == 1
    new = Runtimes("containerd://2.2.9")
    day2.upgrade(loaded, "1.36.0", runner=new)
    assert any("kubeadm upgrade apply" in c for _, c in new.calls)
