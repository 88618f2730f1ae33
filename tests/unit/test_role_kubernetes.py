"""The kubernetes role offline: rendered kubeadm/kubelet/Calico files, their validation against
the typed models and the official schemas, the large-cluster flags, registration taints and
labels, firewall ports, and the operations' decisions against given facts."""

from __future__ import annotations

import base64
import functools
import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

from engine.context import host_context, load, topology_of
from engine.render import render_cluster
from inventory.model import StateAccess
from roles import gpu_health
from roles.fleet_policy.config import FleetPolicyConfig
from roles.kubernetes import encryption
from roles.kubernetes import models as m
from roles.kubernetes import operations as kube_ops
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.coredns import COREDNS_PATCH
from roles.kubernetes.facts import (
    ApiAnswers,
    CgroupVersion,
    EncryptionKeyNames,
    FileExists,
    KubeBinaries,
    KubeletConfigFile,
    ManifestFlags,
)
from roles.kubernetes.kubeadm import (
    INIT_CONFIG,
    JOIN_CONFIG,
    KUBELET_CONF,
    api_server_flags,
    cgroup_findings,
    encryption_flags,
    kubelet_differences,
    kubelet_patch,
)
from roles.kubernetes.models import validate_documents
from roles.kubernetes.role import ROLE
from roles.kubernetes.schemas import validate_text
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import commands
from toolkit import record
from toolkit.facts import HeldPackages
from toolkit.pacing import Pacer, Rate
from toolkit.statefiles import PLACEHOLDER

files_of = functools.partial(shared_files_of, role="kubernetes")


def documents(text: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def kubernetes_yaml(out: Path) -> list[Path]:
    """The rendered Kubernetes documents to validate. The scheduler's configuration is not an
    API object (no schema holds it): tests/unit/test_fleet_policy.py checks what it says. Nor
    is the CoreDNS patch, a fragment of kubeadm's Deployment: tests/unit/test_sizing.py
    validates it inside a whole Deployment."""
    skipped = {Path(FleetPolicyConfig().scheduler_config_path).name, Path(COREDNS_PATCH).name}
    return [p for p in out.rglob("*.yaml") if "kubernetes" in str(p) and p.name not in skipped]


def args(component: dict) -> dict[str, str]:
    return {arg["name"]: arg["value"] for arg in component["extraArgs"]}


def test_sample_render_writes_kubeadm_files_for_every_node_and_all_validate(tmp_path):
    """`gpuinfra render inventory/sample`: init on the first control-plane node, join on every
    other node, and every Kubernetes file (the cluster manifests too) passes validation."""
    loaded = load(SAMPLE / "cluster.yml")
    out = tmp_path / "render"
    render_cluster(loaded, out)
    cluster = loaded.cluster
    nodes = [n for g in ("control_plane", "gpu_worker", "cpu_worker") for n in cluster.in_group(g)]
    first = cluster.in_group("control_plane")[0]
    for node in nodes:
        wanted = INIT_CONFIG if node == first else JOIN_CONFIG
        assert (out / node / wanted.lstrip("/")).is_file(), node
    rendered = kubernetes_yaml(out)
    assert len(rendered) >= 3 * len(nodes)
    problems = [
        str(problem)
        for path in rendered
        for problem in validate_text(path.read_text(), str(path), cluster.versions.kubernetes)
    ]
    assert problems == []


def test_schema_validation_catches_a_bad_field_and_an_unknown_kind():
    """The positive control of the test above: a DaemonSet with a misspelt field, a kubeadm
    document with an unknown field, and a kind no schema holds all fail."""
    bad_daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "templat": {}},
    }
    bad_kubeadm = {"apiVersion": m.KUBEADM_API, "kind": "ClusterConfiguration", "etcdd": {}}
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget"}
    text = yaml.safe_dump_all([bad_daemonset, bad_kubeadm, unknown])
    problems = validate_text(text, "bad.yaml", "1.31.4")
    assert [p.document for p in problems] == [1, 2, 3], problems
    assert "no schema" in problems[2].message


def test_init_file_has_external_etcd_endpoint_and_sans(loaded):
    init = documents(files_of(loaded, "cp-1")[INIT_CONFIG])
    cluster_cfg = init["ClusterConfiguration"]
    etcd = cluster_cfg["etcd"]["external"]
    assert etcd["endpoints"] == [f"https://10.0.0.1{i}:2379" for i in (1, 2, 3)]
    assert etcd["certFile"] == "/etc/kubernetes/pki/apiserver-etcd-client.crt"
    assert etcd["keyFile"] == "/etc/kubernetes/pki/apiserver-etcd-client.key"
    assert etcd["caFile"] == "/etc/kubernetes/pki/etcd/ca.crt"
    assert cluster_cfg["controlPlaneEndpoint"] == "api.small.test:6443"
    assert cluster_cfg["kubernetesVersion"] == "v1.35.4"
    sans = set(cluster_cfg["apiServer"]["certSANs"])
    assert {"api.small.test", "10.0.0.21", "cp-2", "cp-2.small.test", "10.0.0.31"} <= sans
    assert init["KubeletConfiguration"]["serializeImagePulls"] is False
    assert init["KubeletConfiguration"]["cgroupDriver"] == "systemd"
    assert init["InitConfiguration"]["bootstrapTokens"][0]["ttl"] == "15m"
    assert "token" not in init["InitConfiguration"]["bootstrapTokens"][0]
    assert args(cluster_cfg["controllerManager"])["kube-api-qps"] == "100"


def test_etcd_client_paths_match_the_etcd_role(loaded):
    """The paths in the init file are the ones the etcd role's client phase writes."""
    from roles.etcd.files import client_files

    written = {f.path for f in client_files(host_context(loaded, "cp-1"))}
    etcd = documents(files_of(loaded, "cp-1")[INIT_CONFIG])["ClusterConfiguration"]["etcd"]
    assert {etcd["external"][k] for k in ("caFile", "certFile", "keyFile")} == written


def test_goaway_chance_only_with_several_api_servers_behind_a_balancer(small_cluster, load_small):
    two = load_small()
    assert "goaway-chance" in {
        f.name for f in api_server_flags(host_context(two, "cp-1"), KubernetesConfig())
    }
    del small_cluster["hosts"]["cp-2"]
    one = load_small()
    names = {f.name for f in api_server_flags(host_context(one, "cp-1"), KubernetesConfig())}
    assert "goaway-chance" not in names


def test_the_api_servers_shutdown_delay_outlasts_the_slowest_balancers_detection(
    small_cluster, load_small
):
    """/readyz fails at once on SIGTERM; the API server serves on for longer than a balancer
    takes to see it (interval x fall + the check's timeout): lb-1's own settings, or the
    node-local proxies' 2 s x 3 + 5 s, and a 5 s margin."""

    def delay(loaded) -> str:
        flags = api_server_flags(host_context(loaded, "cp-1"), KubernetesConfig())
        return {f.name: f.value for f in flags}["shutdown-delay-duration"]

    assert delay(load_small()) == "16s"  # lb-1 at the defaults
    small_cluster["group_vars"] = {
        "loadbalancer": {"loadbalancer": {"check_interval": "3000ms", "check_fall": 5}}
    }
    assert delay(load_small()) == "25s"  # 15 + 5 + 5
    del small_cluster["hosts"]["lb-1"]
    assert delay(load_small()) == "16s"  # the node-local proxies


def test_secrets_are_encrypted_at_rest_with_a_key_kept_private_in_the_state(
    small_cluster, write_cluster, load_small
):
    """Every API server reads one EncryptionConfiguration (secretbox first, identity to read
    what was written before) from a 0600 file never shown in a diff, mounted as a folder so a
    rotated key is reloaded; the key is made once, 0600, and plan's placeholder rendering makes
    none. Off: no file, no flag, no mount."""
    inventory = write_cluster(small_cluster)
    quiet = load(inventory).with_state_access(StateAccess.placeholder)
    assert encryption.ENCRYPTION_CONFIG in files_of(quiet, "cp-1")
    key_file = quiet.state_dir / encryption.KEY_STATE
    assert not key_file.exists()
    # plan and drift before the role's first apply: the file is one the next apply makes.
    reading = load(inventory).with_state_access(StateAccess.existing)
    assert PLACEHOLDER in encryption.config_file(reading).content
    assert not key_file.exists()
    loaded = load(inventory)
    configs = {
        node: files_of(loaded, node, contents=False).get(encryption.ENCRYPTION_CONFIG)
        for node in ("cp-1", "cp-2", "gpu-1")
    }
    assert configs["gpu-1"] is None
    assert configs["cp-1"].content == configs["cp-2"].content
    assert (configs["cp-1"].mode, configs["cp-1"].secret) == ("0600", True)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(base64.b64decode(key)) == 32
    (config,) = validate_documents(configs["cp-1"].content)
    (resources,) = config.resources
    assert resources.resources == ["secrets"]
    assert resources.providers == [
        {"secretbox": {"keys": [{"name": encryption.key_name(key), "secret": key}]}},
        {"identity": {}},
    ]
    assert key not in encryption.key_name(key)
    cluster = documents(files_of(loaded, "cp-1")[INIT_CONFIG])["ClusterConfiguration"]
    flags = args(cluster["apiServer"])
    assert flags["encryption-provider-config"] == encryption.ENCRYPTION_CONFIG
    assert flags["encryption-provider-config-automatic-reload"] == "true"
    mounts = {v["name"]: v for v in cluster["apiServer"]["extraVolumes"]}
    assert mounts["encryption-config"]["hostPath"] == encryption.ENCRYPTION_DIR
    assert mounts["encryption-config"]["readOnly"] is True
    assert (
        files_of(load(inventory), "cp-1")[encryption.ENCRYPTION_CONFIG] == configs["cp-1"].content
    )

    small_cluster["group_vars"] = {"all": {"kubernetes": {"encrypt_secrets": False}}}
    off = load_small()
    assert encryption.ENCRYPTION_CONFIG not in files_of(off, "cp-1")
    cluster = documents(files_of(off, "cp-1")[INIT_CONFIG])["ClusterConfiguration"]
    assert not any(name.startswith("encryption") for name in args(cluster["apiServer"]))
    assert "encryption-config" not in {v["name"] for v in cluster["apiServer"]["extraVolumes"]}


def test_a_key_other_than_the_kept_one_on_a_node_stops_the_apply(tmp_path):
    """The check before the file is written: the node's file read back by its real command
    gives the names only; a node whose file holds a key the written file would drop is a
    finding naming both keys and no secret, a key added by hand beside the kept one too. The
    controls: no file (a first apply) and the kept key alone pass."""
    kept, other = encryption.new_key(), encryption.new_key()
    config = tmp_path / "config.yaml"
    config.write_text(encryption.config_file_text(other))
    fact = EncryptionKeyNames()
    read = subprocess.run(
        ["sh", "-c", fact.command(path=str(config))], capture_output=True, text=True, check=True
    )
    on_node = fact.process(read.stdout.splitlines())
    assert on_node == [encryption.key_name(other)]
    (finding,) = encryption.lost_keys(on_node, kept)
    assert encryption.key_name(other) in finding and encryption.key_name(kept) in finding
    assert kept not in finding and other not in finding
    assert encryption.KEY_STATE in finding
    missing = subprocess.run(
        ["sh", "-c", fact.command(path=str(tmp_path / "none.yaml"))],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert fact.process(missing.stdout.splitlines()) == []
    assert encryption.lost_keys([], kept) == []
    assert encryption.lost_keys([encryption.key_name(kept)], kept) == []
    both = [encryption.key_name(kept), encryption.key_name(other)]
    (beside,) = encryption.lost_keys(both, kept)
    assert encryption.key_name(other) in beside


def test_the_node_local_proxy_checks_readyz(small_cluster, load_small):
    del small_cluster["hosts"]["lb-1"]
    loaded = load_small()
    proxy = files_of(loaded, "cpu-1")["/etc/kubernetes/gpuinfra/api-proxy.cfg"]
    assert "    http-check send meth GET uri /readyz\n" in proxy
    assert "    default-server check check-ssl verify none inter 2s fall 3 rise 2\n" in proxy
    assert "tcp-check" not in proxy


def test_events_etcd_only_when_configured(small_cluster, load_small):
    plain = load_small()
    init = documents(files_of(plain, "cp-1")[INIT_CONFIG])
    assert "etcd-servers-overrides" not in args(init["ClusterConfiguration"]["apiServer"])
    small_cluster["group_vars"] = {
        "control_plane": {
            "kubernetes": {
                "events_etcd_endpoints": ["https://10.0.0.81:2379", "https://10.0.0.82:2379"]
            }
        }
    }
    events = load_small()
    init = documents(files_of(events, "cp-1")[INIT_CONFIG])
    value = args(init["ClusterConfiguration"]["apiServer"])["etcd-servers-overrides"]
    assert value == "/events#https://10.0.0.81:2379;https://10.0.0.82:2379"


def test_gpu_workers_register_with_the_preflight_taint_and_labels(loaded):
    gpu = documents(files_of(loaded, "gpu-1")[JOIN_CONFIG])["JoinConfiguration"]
    registration = gpu["nodeRegistration"]
    assert registration["taints"] == [
        {
            "key": gpu_health.PREFLIGHT_TAINT_KEY,
            "value": gpu_health.PREFLIGHT_TAINT_VALUE,
            "effect": gpu_health.PREFLIGHT_TAINT_EFFECT,
        }
    ]
    labels = args(registration | {"extraArgs": registration["kubeletExtraArgs"]})["node-labels"]
    assert f"{gpu_health.GPU_WORKER_LABEL_KEY}={gpu_health.GPU_WORKER_LABEL_VALUE}" in labels
    assert gpu["discovery"]["bootstrapToken"]["caCertHashes"] == [m.CA_HASH_PLACEHOLDER]
    cpu = documents(files_of(loaded, "cpu-1")[JOIN_CONFIG])["JoinConfiguration"]
    assert cpu["nodeRegistration"]["taints"] == []
    assert "controlPlane" not in cpu
    cp2 = documents(files_of(loaded, "cp-2")[JOIN_CONFIG])["JoinConfiguration"]
    assert cp2["controlPlane"]["certificateKey"] == m.CERT_KEY_PLACEHOLDER
    assert "taints" not in cp2["nodeRegistration"]  # kubeadm's own control-plane taint


def test_rendered_files_hold_no_secret(loaded):
    for node in ("cp-1", "cp-2", "gpu-1", "cpu-1"):
        for path, content in files_of(loaded, node).items():
            assert not kube_ops.re.search(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b", content), path


def test_models_refuse_unknown_fields_and_unpinned_discovery():
    with pytest.raises(ValidationError):
        m.KubeletConfiguration(maxPods=110, serialiseImagePulls=False)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        m.BootstrapTokenDiscovery(
            apiServerEndpoint="api:6443",
            token=m.TOKEN_PLACEHOLDER,
            caCertHashes=[m.CA_HASH_PLACEHOLDER],
            unsafeSkipCAVerification=True,
        )
    with pytest.raises(ValidationError):
        m.BootstrapTokenDiscovery(apiServerEndpoint="api:6443", token="short", caCertHashes=["x"])
    with pytest.raises(ValueError, match="no model"):
        validate_documents("apiVersion: kubeadm.k8s.io/v1beta3\nkind: InitConfiguration\n")
    with pytest.raises(ValidationError):
        m.IPPool(
            metadata=m.ObjectMeta(name="p"),
            spec=m.IPPoolSpec(cidr="10.0.0.0/8", blockSize=26, natOutgoing=True, ipipMode="Always"),
        )


def test_config_rejects_bad_rates_and_unpinned_binaries():
    with pytest.raises(ValidationError, match="invalid rate"):
        KubernetesConfig(join_rate="fast")
    with pytest.raises(ValidationError, match="binary_sha256"):
        KubernetesConfig(source="binaries")
    KubernetesConfig(
        source="binaries",
        binary_sha256={b: "a" * 64 for b in (*kube_ops.PACKAGES, "crictl", "cni-plugins")},
    )


def test_bgp_port_between_kubernetes_nodes_only(loaded):
    rules = ROLE.ports(loaded)
    nodes = {"10.0.0.21", "10.0.0.22", "10.0.0.61", "10.0.0.71"}
    for group in ("control_plane", "gpu_worker", "cpu_worker"):
        (rule,) = [r for r in rules[group] if r.port == 179]
        assert (rule.port, rule.protocol, set(rule.sources)) == (179, "tcp", nodes)
    topology = topology_of(loaded)
    bgp = [r for r in topology.rules_for(["gpu_worker"]) if r.port == 179]
    assert len(bgp) == 1 and set(bgp[0].sources) == nodes
    assert not [r for r in topology.rules_for(["etcd"]) if r.port == 179]


# ---------------------------------------------------------------- operations


def test_packages_installed_and_held_is_a_noop_and_missing_ones_stop_with_one_message():
    cfg = KubernetesConfig()
    installed = {name: ["1.31.4-1.1"] for name in kube_ops.PACKAGES}
    facts = {
        kube_ops.DebPackages: installed,
        HeldPackages: list(kube_ops.PACKAGES),
    }
    done, noops = commands(
        kube_ops.kubernetes_installed,
        facts,
        cfg=cfg,
        version="1.31.4",
        repo="https://pkgs.k8s.io/core:/stable:/v1.31/deb/",
    )
    assert done == [] and noops
    facts[kube_ops.DebPackages] = {}
    done, _ = commands(
        kube_ops.kubernetes_installed,
        facts,
        cfg=cfg,
        version="1.31.4",
        repo="https://pkgs.k8s.io/core:/stable:/v1.31/deb/",
    )
    assert "apt-cache madison kubeadm" in done[0] and "1.31.4-1.1" in done[0]
    assert "is not in any apt source" in done[0]
    assert "kubeadm=1.31.4-1.1" in done[1] and done[2].startswith("apt-mark hold")


def test_preinstalled_binaries_of_another_version_stop_the_host():
    cfg = KubernetesConfig(source="preinstalled")
    wrong = {KubeBinaries: {"kubeadm": "v1.30.2", "kubelet": "v1.31.4", "kubectl": "v1.31.4"}}
    with pytest.raises(kube_ops.OperationError, match="kubeadm v1.30.2"):
        commands(kube_ops.kubernetes_installed, wrong, cfg=cfg, version="1.31.4", repo="")
    right = {KubeBinaries: {name: "v1.31.4" for name in kube_ops.PACKAGES}}
    assert (
        commands(kube_ops.kubernetes_installed, right, cfg=cfg, version="1.31.4", repo="")[0] == []
    )


def test_init_runs_once_validating_first_and_never_again():
    fresh = {ApiAnswers: {"kubeconfig": False, "healthy": False}}
    done, _ = commands(
        kube_ops.control_plane_initialised, fresh, first=True, config=INIT_CONFIG, timeout_s=60
    )
    assert done[0] == f"kubeadm config validate --config {INIT_CONFIG}"
    assert done[1].startswith(f"kubeadm init --config {INIT_CONFIG} --upload-certs")
    assert "--skip-token-print" in done[1] and "--skip-certificate-key-print" in done[1]
    healthy = {ApiAnswers: {"kubeconfig": True, "healthy": True}}
    assert (
        commands(
            kube_ops.control_plane_initialised,
            healthy,
            first=True,
            config=INIT_CONFIG,
            timeout_s=60,
        )[0]
        == []
    )
    slow = {ApiAnswers: {"kubeconfig": True, "healthy": False}}
    done, _ = commands(
        kube_ops.control_plane_initialised, slow, first=True, config=INIT_CONFIG, timeout_s=60
    )
    assert len(done) == 1 and "kubeadm init" not in done[0] and "/healthz" in done[0]
    assert (
        commands(
            kube_ops.control_plane_initialised, fresh, first=False, config=INIT_CONFIG, timeout_s=60
        )[0]
        == []
    )


def test_joined_nodes_do_nothing_and_new_ones_join_through_a_function():
    joined = {FileExists: True}
    assert (
        commands(
            kube_ops.worker_joined,
            joined,
            first_name="cp-1",
            content="",
            token_ttl="15m",
            rate="5/10s",
        )[0]
        == []
    )
    fresh = {FileExists: False}
    with_ops = kube_ops.worker_joined._inner
    from tests.unit.fake_host import fake_host

    with fake_host(fresh):
        (command,) = list(with_ops(first_name="cp-1", content="", token_ttl="15m", rate="5/10s"))
    assert isinstance(command, kube_ops.FunctionCommand)
    assert command.function is kube_ops.run_join
    assert KUBELET_CONF.endswith("kubelet.conf")


class _Output:
    def __init__(self, lines: list[str]):
        self.lines = [SimpleNamespace(line=line) for line in lines]
        self.stdout = "\n".join(lines)

    def __iter__(self):
        return iter(self.lines)


class _Node:
    """A pyinfra host stand-in that answers kubeadm's commands and records what it ran."""

    def __init__(self, name: str, answers: list[tuple[bool, list[str]]] | None = None):
        self.name = name
        self.ran: list[str] = []
        self.uploaded: list[tuple[str, str]] = []
        self.answers = list(answers or [])

    def run_shell_command(self, command, **_kwargs):
        text = str(command)
        self.ran.append(text)
        if "token create" in text:
            return True, _Output(
                [
                    "kubeadm join api.small.test:6443 --token abcdef.0123456789abcdef "
                    "--discovery-token-ca-cert-hash sha256:" + "b" * 64
                ]
            )
        if "upload-certs" in text:
            return True, _Output(["[upload-certs] Using certificate key:", "c" * 64])
        if "kubeadm join" in text and self.answers:
            return self.answers.pop(0)
        return True, _Output([])

    def put_file(self, src, dest, **_kwargs):
        self.uploaded.append((dest, src.getvalue()))
        return True


class _State:
    def __init__(self, first: _Node):
        self.first = first
        self.active_hosts = {first}
        self.inventory = SimpleNamespace(
            get_host=lambda name: first if name == first.name else None
        )


class _CountingPacer(Pacer):
    """Counts the slots taken; with `node`, notes what that node had done when each came."""

    def __init__(self, node: _Node | None = None):
        super().__init__(Rate(5, 10), clock=lambda: 0.0, sleep=lambda s: None)
        self.acquired = 0
        self.node = node
        self.seen: list[tuple[int, int]] = []  # (commands run, files uploaded) at each slot

    def acquire(self) -> float:
        self.acquired += 1
        if self.node is not None:
            self.seen.append((len(self.node.ran), len(self.node.uploaded)))
        return 2.5


def test_join_fills_secrets_into_a_private_copy_and_reports_none(loaded, monkeypatch):
    """A control-plane join: token, CA hash and certificate key come from the first node, land
    only in the copy under the 0700 directory, and a failure's report holds none of them."""
    first = _Node("cp-1")
    joining = _Node(
        "cp-2",
        answers=[(False, _Output(["error: token abcdef.0123456789abcdef rejected", "c" * 64]))],
    )
    state = _State(first)
    content = files_of(loaded, "cp-2")[JOIN_CONFIG]
    with record.recording() as run:
        ok = kube_ops.run_join(state, joining, "cp-1", content, True, "15m", None)
    assert ok is False
    ((dest, text),) = joining.uploaded
    assert dest.startswith(kube_ops.SECRET_DIR + "/")
    assert "abcdef.0123456789abcdef" in text and "c" * 64 in text and "sha256:" + "b" * 64 in text
    validate_documents(text)  # the filled-in copy is a valid JoinConfiguration
    join = next(c for c in joining.ran if "kubeadm join" in c)
    assert "kubeadm config validate" in join.split("kubeadm join")[0]
    assert "rm -f" in join and "abcdef" not in join
    (check,) = run.host("cp-2").checks  # the run's record: the report's error for the host
    assert "abcdef.0123456789abcdef" not in check["detail"] and "c" * 64 not in check["detail"]
    assert "<redacted" in check["detail"]
    assert not any("abcdef" in c for c in first.ran)  # the token is read, never passed


def test_worker_join_takes_a_pacer_slot_and_slows_down_on_429(loaded, monkeypatch):
    pacer = _CountingPacer()
    monkeypatch.setattr(kube_ops, "shared_pacer", lambda name, rate: pacer)
    throttled = (
        False,
        _Output(["error execution phase: the server responded 429 Too Many Requests"]),
    )
    worker = _Node("cpu-1", answers=[throttled, (True, _Output(["This node has joined"]))])
    content = files_of(loaded, "cpu-1")[JOIN_CONFIG]
    assert kube_ops.run_join(_State(_Node("cp-1")), worker, "cp-1", content, False, "15m", "5/10s")
    assert pacer.acquired == 2  # the retry waited for a new slot
    assert pacer.slowdown == 1.0  # doubled by the 429, halved again by the success
    other = _Node("cpu-2", answers=[(False, _Output(["bad config"]))])
    pacer.acquired = 0
    assert not kube_ops.run_join(
        _State(_Node("cp-1")), other, "cp-1", content, False, "15m", "5/10s"
    )
    assert pacer.acquired == 1  # a plain failure is not retried


def test_a_worker_takes_its_slot_after_the_upload_and_the_report_says_when(loaded, monkeypatch):
    """The slot comes right before the join: the copy of the join file is done, so the time a
    host takes for it never shortens the spacing the API sees; the run's record keeps the
    slot's wall-clock time and the wait."""
    worker = _Node("cpu-1")
    pacer = _CountingPacer(worker)
    monkeypatch.setattr(kube_ops, "shared_pacer", lambda name, rate: pacer)
    monkeypatch.setattr(kube_ops, "wall_seconds", lambda: 1234.5)
    content = files_of(loaded, "cpu-1")[JOIN_CONFIG]
    with record.recording() as run:
        assert kube_ops.run_join(
            _State(_Node("cp-1")), worker, "cp-1", content, False, "15m", "5/10s"
        )
    assert pacer.seen == [(1, 1)]  # after the directory and the upload, before the join
    assert "kubeadm join" in worker.ran[1]
    (slot,) = [c for c in run.host("cpu-1").checks if c["check"] == kube_ops.JOIN_SLOT_CHECK]
    assert slot["status"] == "ok" and slot["at"] == 1234.5
    assert "after 2.5 s" in slot["detail"] and "5/10s" in slot["detail"]


PREFLIGHT_FAILED = [
    "[preflight] Running pre-flight checks",
    "error execution phase preflight: [preflight] Some fatal errors occurred:",
    "\t[ERROR ImagePull]: failed to pull image registry.k8s.io/kube-apiserver:v1.35.4: "
    "context deadline exceeded",
    "[preflight] If you know what you are doing, you can make a check non-fatal with "
    "`--ignore-preflight-errors=...`",
    "error: error execution phase preflight: preflight checks failed",
    "To see the stack trace of this error execute with --v=5 or higher",
]


def test_a_join_whose_preflight_failed_is_tried_again_and_names_the_check(loaded, monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr(kube_ops.time, "sleep", pauses.append)
    content = files_of(loaded, "cp-2")[JOIN_CONFIG]
    failed = (False, _Output(PREFLIGHT_FAILED))
    once = _Node("cp-2", answers=[failed, (True, _Output(["This node has joined"]))])
    assert kube_ops.run_join(_State(_Node("cp-1")), once, "cp-1", content, True, "15m", None)
    assert pauses == [kube_ops.PREFLIGHT_RETRY_S]  # nothing changed on the node: tried again
    always = _Node("cp-3", answers=[failed] * kube_ops.JOIN_ATTEMPTS)
    with record.recording() as run:
        assert not kube_ops.run_join(
            _State(_Node("cp-1")), always, "cp-1", content, True, "15m", None
        )
    assert sum("kubeadm join" in c for c in always.ran) == kube_ops.JOIN_ATTEMPTS
    (check,) = run.host("cp-3").checks
    assert check["detail"].startswith("kubeadm join: [ERROR ImagePull]: failed to pull image")
    assert check["detail"].endswith("execute with --v=5 or higher")
    # The control: a join that failed past its preflight is not tried again.
    later = _Node("cp-2", answers=[(False, _Output(["error execution phase kubelet-start: x"]))])
    assert not kube_ops.run_join(_State(_Node("cp-1")), later, "cp-1", content, True, "15m", None)
    assert sum("kubeadm join" in c for c in later.ran) == 1


def test_join_without_the_first_control_plane_node_says_so(loaded):
    worker = _Node("cpu-1")
    state = _State(_Node("cp-1"))
    state.active_hosts = set()
    content = files_of(loaded, "cpu-1")[JOIN_CONFIG]
    with record.recording() as run:
        assert not kube_ops.run_join(state, worker, "cp-1", content, False, "15m", None)
    assert "is not in this run" in run.host("cpu-1").checks[0]["detail"]


def test_operator_kubeconfig_is_private_from_creation(tmp_path):
    target = tmp_path / "state" / "kubernetes" / "admin.conf"
    old = os.umask(0)
    try:
        kube_ops.write_private(target, b"apiVersion: v1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert Path(target).read_bytes() == b"apiVersion: v1\n"


def test_an_unreachable_package_key_stops_with_one_line():
    from toolkit.aptkeys import KeyFingerprints

    done, _ = commands(
        kube_ops.repository_key,
        {KeyFingerprints: []},
        enabled=True,
        url="https://pkgs.k8s.io/x/Release.key",
        fingerprint="AB",
        dest="/k.asc",
    )
    curl = next(c for c in done if c.startswith("curl "))
    assert "2>/dev/null ||" in curl and "set kubernetes.source to mirror" in curl
    assert (
        commands(
            kube_ops.repository_key,
            {KeyFingerprints: ["AB"]},
            enabled=True,
            url="u",
            fingerprint="ab",
            dest="/k.asc",
        )[0]
        == []
    )


# ---------------------------------------------------------------- node-local API balancing

KUBESPRAY_LOCAL_LB = Path(__file__).parent / "data" / "kubespray_local_lb" / "inventory.ini"


def test_kubespray_inventory_without_balancers_imports_with_node_local_proxies(tmp_path):
    """A Kubespray inventory with three kube_control_plane hosts and no load-balancer group
    imports into a cluster that validates; every node then dials its own proxy, which fronts
    every API server, and the rendered files validate."""
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path / "imported" / "cluster.yml"
    result = CliRunner().invoke(
        app, ["inventory", "import", str(KUBESPRAY_LOCAL_LB), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, ["inventory", "validate", str(out)]).exit_code == 0
    loaded = load(out)
    assert loaded.cluster.in_group("control_plane") == ["master1", "master2", "master3"]
    assert loaded.cluster.in_group("loadbalancer") == []
    for node in ("master1", "master2", "worker1"):
        written = files_of(loaded, node)
        proxy = written["/etc/kubernetes/gpuinfra/api-proxy.cfg"]
        assert "bind 127.0.0.1:6444" in proxy
        for address in ("10.30.0.11", "10.30.0.12", "10.30.0.13"):
            assert f"{address}:6443" in proxy
        assert "/etc/systemd/system/kube-api-proxy.service" in written
    init = documents(files_of(loaded, "master1")[INIT_CONFIG])
    assert init["ClusterConfiguration"]["controlPlaneEndpoint"] == "127.0.0.1:6444"
    assert "127.0.0.1" in init["ClusterConfiguration"]["apiServer"]["certSANs"]
    join = documents(files_of(loaded, "worker1")[JOIN_CONFIG])["JoinConfiguration"]
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "127.0.0.1:6444"
    rendered = tmp_path / "render"
    render_cluster(loaded, rendered)
    problems = [
        str(problem)
        for path in kubernetes_yaml(rendered)
        for problem in validate_text(
            path.read_text(), str(path), loaded.cluster.versions.kubernetes
        )
    ]
    assert problems == []


def test_with_a_balancer_no_node_runs_its_own_proxy(loaded):
    for node in ("cp-1", "cpu-1"):
        assert "/etc/kubernetes/gpuinfra/api-proxy.cfg" not in files_of(loaded, node)
    init = documents(files_of(loaded, "cp-1")[INIT_CONFIG])
    assert init["ClusterConfiguration"]["controlPlaneEndpoint"] == "api.small.test:6443"


def test_disabled_role_writes_and_runs_nothing(small_cluster, load_small):
    small_cluster["group_vars"] = {"all": {"kubernetes": {"enabled": False}}}
    disabled = load_small()
    assert files_of(disabled, "cp-1") == {} and files_of(disabled, "gpu-1") == {}
    from roles.kubernetes.cni import cluster_files

    assert cluster_files(disabled) == {}
    with_ops = kube_ops.disabled._inner
    from tests.unit.fake_host import fake_host

    with fake_host({}) as host:
        assert list(with_ops()) == []
    assert host.noops and "kubernetes.enabled: false" in host.noops[0]


def test_operator_kubeconfig_points_past_the_node_local_proxy(tmp_path):
    """With the node-local proxy, the copy's server is the first API server, and the node's own
    digest is kept beside it so an unchanged admin.conf is not fetched again."""

    class Node:
        def get_file(self, remote, buffer, **_kwargs):
            buffer.write(b"clusters:\n- cluster:\n    server: https://127.0.0.1:6444\n")
            return True

    local = tmp_path / "kubernetes" / "admin.conf"
    assert kube_ops._fetch_kubeconfig(None, Node(), str(local), "https://10.0.0.21:6443")
    assert "server: https://10.0.0.21:6443" in local.read_text()
    digest = (local.parent / "admin.conf.sha1").read_text()
    assert len(digest) == 40 and stat.S_IMODE(local.stat().st_mode) == 0o600
    from pyinfra.facts.files import Sha1File

    done, noops = commands(
        kube_ops.operator_kubeconfig, {Sha1File: digest}, first=True, local=str(local)
    )
    assert done == [] and noops
    changed, _ = commands(
        kube_ops.operator_kubeconfig, {Sha1File: "0" * 40}, first=True, local=str(local)
    )
    assert len(changed) == 1


# kubelet's file as kubeadm 1.35 writes it (the parts that matter here, in its key order).
KUBELET_FILE = """apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
cgroupDriver: cgroupfs
evictionHard:
  imagefs.available: 15%
  memory.available: 500Mi
  nodefs.available: 10%
kind: KubeletConfiguration
kubeReserved:
  cpu: 500m
  memory: 1Gi
maxPods: 110
systemReserved:
  cpu: 500m
  ephemeral-storage: 1Gi
  memory: 1Gi
"""


def test_kubelets_file_is_read_back_and_compared_setting_by_setting(tmp_path):
    """47.3: drift reads kubelet's own file (what it runs), not the patch; each setting of
    the node's patch it does not hold is named with both values. The control: the file as
    kubeadm merged the same settings is no finding; no file (before the join) reads None."""
    cfg = KubernetesConfig(
        max_pods=110,
        system_reserved={"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
        kube_reserved={"cpu": "500m", "memory": "1Gi"},
        eviction_hard={"memory.available": "500Mi", "nodefs.available": "10%",
                       "imagefs.available": "15%"},
    )  # fmt: skip
    fact, path = KubeletConfigFile(), tmp_path / "config.yaml"

    def read(text: str | None) -> dict | None:
        if text is not None:
            path.write_text(text)
        command = fact.command(path=str(path))
        found = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return fact.process(found.stdout.splitlines())

    patch = kubelet_patch(cfg)
    assert read(None) is None
    assert kubelet_differences(read(KUBELET_FILE), patch) == []
    edited = (
        KUBELET_FILE.replace("maxPods: 110", "maxPods: 100")
        .replace("  memory: 1Gi\nmaxPods", "  memory: 2Gi\nmaxPods")
        .replace("  nodefs.available: 10%\n", "")
    )
    found = kubelet_differences(read(edited), patch)
    where = "kubelet: /var/lib/kubelet/config.yaml sets"
    assert sorted(found) == sorted([
        f"{where} maxPods to 100, the node's settings maxPods to 110",
        f"{where} kubeReserved.memory to 2Gi, the node's settings kubeReserved.memory to 1Gi",
        f"{where} no evictionHard.nodefs.available, the node's settings "
        "evictionHard.nodefs.available to 10%",
    ]), found  # fmt: skip
    assert read("not: [a mapping") is None


API_SERVER_POD = """apiVersion: v1
kind: Pod
metadata:
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - command:
    - kube-apiserver
    - --advertise-address=10.0.0.21
    - --encryption-provider-config=/etc/kubernetes/encryption/config.yaml
    - --encryption-provider-config-automatic-reload=true
    - --etcd-servers=https://10.0.0.11:2379
    image: registry.k8s.io/kube-apiserver:v1.35.4
    name: kube-apiserver
"""


def test_an_api_server_running_without_the_encryption_flag_is_a_finding(tmp_path):
    """Issue 47.6: on a cluster initialised without encryption, an apply writes the file and
    the running API server never reads it (kubeadm writes its manifest at init, join and
    upgrade only), so Secrets stay in clear while the inventory says otherwise. The node's
    manifest read by the fact's real command: the flag gone (its -automatic-reload sibling
    left, which a prefix match would take for it) is a finding naming the way out; the
    controls: the manifest kubeadm writes from our flags, and no manifest (before the init)."""
    fact, manifest = ManifestFlags(), tmp_path / "kube-apiserver.yaml"

    def read() -> list[str] | None:
        command = fact.command(path=str(manifest))
        found = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return fact.process(found.stdout.splitlines())

    assert read() is None
    assert encryption.unencrypted(read(), str(manifest)) == []
    manifest.write_text(API_SERVER_POD)
    assert read() == [
        "--advertise-address", f"--{encryption.FLAG}", f"--{encryption.FLAG}-automatic-reload",
        "--etcd-servers",
    ]  # fmt: skip
    assert encryption.unencrypted(read(), str(manifest)) == []
    manifest.write_text(API_SERVER_POD.replace("    - --encryption-provider-config=/etc", "#"))
    (finding,) = encryption.unencrypted(read(), str(manifest))
    assert f"runs the API server without --{encryption.FLAG}" in finding
    assert "kubernetes.encrypt_secrets: false" in finding
    # The flag looked for is the one the role gives the API server.
    assert encryption.FLAG in {f.name for f in encryption_flags(KubernetesConfig())}


def test_a_cgroup_v1_host_stops_before_kubelet_is_installed():
    """Issue 46: kubelet 1.35+ refuses cgroup v1 (KEP-5573), and a join would wait minutes on
    a kubelet that exits at once. The check names the way out; the controls: cgroup v2, the
    lab's declared escape (fail_cgroup_v1 false), a minor before 1.35, an unreadable host."""
    fact = CgroupVersion()
    here = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True)
    assert fact.process(here.stdout.splitlines()) in ("v1", "v2")  # this machine's own
    assert fact.process(["cgroup2fs"]) == "v2" and fact.process(["tmpfs"]) == "v1"
    assert fact.process([]) is None and fact.process(["ext2/ext3"]) is None
    strict = KubernetesConfig()
    (finding,) = cgroup_findings("v1", strict, (1, 35))
    assert "cgroup v1, which kubelet 1.35 refuses" in finding
    assert "kubernetes.fail_cgroup_v1: false" in finding
    escaped = KubernetesConfig(fail_cgroup_v1=False, accept_unsafe=["fail_cgroup_v1"])
    assert cgroup_findings("v2", strict, (1, 36)) == []
    assert cgroup_findings("v1", escaped, (1, 35)) == []
    assert cgroup_findings("v1", strict, (1, 34)) == []
    assert cgroup_findings(None, strict, (1, 35)) == []
