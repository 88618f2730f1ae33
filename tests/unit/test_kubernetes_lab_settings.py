"""The kubernetes role's settings for an offline, cgroup v1 cluster (what the lab runs), offline:
the routed pod network, the kubeadm and kubelet documents, and the inventory checks."""

from __future__ import annotations

import functools
import ipaddress
import json

import yaml
from typer.testing import CliRunner

from cli.main import app
from engine.context import host_contexts, host_files, load
from inventory.topology import pod_block
from roles.kubernetes import operations as kube_ops
from roles.kubernetes.cni import CNI_CONFIG, POD_ROUTES_SCRIPT
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.kubeadm import INIT_CONFIG
from tests.helpers import files_of as shared_files_of
from toolkit.templates import environment

runner = CliRunner()
LAB_LIKE = {
    "cni": "routes",
    "cgroup_driver": "cgroupfs",
    "fail_cgroup_v1": False,
    "accept_unsafe": ["fail_cgroup_v1"],
    "ignore_preflight_errors": ["SystemVerification"],
    "kube_proxy_mode": "nftables",
    "kube_proxy_conntrack_max_per_core": 0,
    "coredns_image_tag": "v1.14.7",
}


def lab_like(small_cluster, write_cluster, **kubernetes):
    small_cluster["group_vars"] = {
        "all": {
            "kubernetes": {**LAB_LIKE, **kubernetes},
            "container_runtime": {"cgroup_driver": "cgroupfs"},
        }
    }
    return load(write_cluster(small_cluster))


files_of = functools.partial(shared_files_of, role="kubernetes")


def test_each_node_gets_the_block_of_its_own_address_and_routes_to_the_others(
    small_cluster, write_cluster
):
    loaded = lab_like(small_cluster, write_cluster)
    cfg = next(c for c in host_contexts(loaded) if c.name == "cpu-1").config(KubernetesConfig)
    cni = json.loads(files_of(loaded, "cpu-1")[CNI_CONFIG])
    bridge, portmap = cni["plugins"]
    # hostPort: kubelet hands the mappings to the chain's portmap, in nftables as the firewall.
    assert portmap["type"] == "portmap" and portmap["capabilities"] == {"portMappings": True}
    assert portmap["backend"] == "nftables"
    # 10.0.0.71 is offset 71 in 10.0.0.0/24: block 71 of the default pod network's /24s.
    pods = loaded.cluster.networks.pod
    expected = list(pods.subnets(new_prefix=24))[71]
    assert bridge["ipam"]["ranges"] == [[{"subnet": str(expected)}]]
    assert bridge["ipMasq"] is False
    script = files_of(loaded, "cpu-1")[POD_ROUTES_SCRIPT]
    routes = [line for line in script.splitlines() if line.startswith("route replace")]
    others = ["cp-1", "cp-2", "gpu-1"]  # every other Kubernetes node, never itself
    assert len(routes) == len(others)
    for name in others:
        block = pod_block(loaded.cluster, name, cfg.routes_block_prefix)
        assert f"route replace {block} via {loaded.cluster.hosts[name].address}" in script
    assert str(expected) not in "\n".join(routes)
    assert f"route flush root {pods} proto static" in script


def test_a_block_does_not_move_when_other_hosts_come_and_go(small_cluster, write_cluster):
    before = lab_like(small_cluster, write_cluster)
    cfg = next(c for c in host_contexts(before) if c.name == "cpu-1").config(KubernetesConfig)
    block = pod_block(before.cluster, "cpu-1", cfg.routes_block_prefix)
    small_cluster["hosts"]["cpu-0"] = {"address": "10.0.0.70", "groups": ["cpu_worker"]}
    del small_cluster["hosts"]["cp-2"]
    after = load(write_cluster(small_cluster, "after.yml"))
    assert pod_block(after.cluster, "cpu-1", cfg.routes_block_prefix) == block
    assert isinstance(block, ipaddress.IPv4Network)


def test_kubeadm_and_kubelet_carry_the_cgroup_v1_and_offline_settings(small_cluster, write_cluster):
    loaded = lab_like(small_cluster, write_cluster)
    documents = {
        doc["kind"]: doc for doc in yaml.safe_load_all(files_of(loaded, "cp-1")[INIT_CONFIG])
    }
    assert documents["InitConfiguration"]["nodeRegistration"]["ignorePreflightErrors"] == [
        "SystemVerification"
    ]
    kubelet = documents["KubeletConfiguration"]
    assert (kubelet["cgroupDriver"], kubelet["failCgroupV1"]) == ("cgroupfs", False)
    proxy = documents["KubeProxyConfiguration"]
    assert (proxy["mode"], proxy["conntrack"]) == ("nftables", {"maxPerCore": 0})
    cluster = documents["ClusterConfiguration"]
    assert cluster["dns"] == {"imageTag": "v1.14.7"}
    assert "imageRepository" not in cluster  # registry.k8s.io, through containerd's mirror
    flags = {a["name"]: a["value"] for a in cluster["controllerManager"]["extraArgs"]}
    assert flags["allocate-node-cidrs"] == "false"  # the blocks come from the inventory


def test_production_defaults_write_none_of_the_lab_settings(loaded):
    """Negative control: without them, nothing of the above is in the documents."""
    text = files_of(loaded, "cp-1")[INIT_CONFIG]
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(text)}
    assert documents["KubeletConfiguration"]["cgroupDriver"] == "systemd"
    assert "failCgroupV1" not in documents["KubeletConfiguration"]
    assert "ignorePreflightErrors" not in documents["InitConfiguration"]["nodeRegistration"]
    assert "conntrack" not in documents["KubeProxyConfiguration"]
    assert CNI_CONFIG not in files_of(loaded, "cp-1")


def validate(path) -> tuple[int, str]:
    result = runner.invoke(app, ["inventory", "validate", str(path)])
    return result.exit_code, result.stderr


def test_kubelet_and_containerd_must_share_a_cgroup_driver(small_cluster, write_cluster):
    small_cluster["group_vars"] = {"all": {"kubernetes": {"cgroup_driver": "cgroupfs"}}}
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "kubernetes.cgroup_driver" in err and "container_runtime.cgroup_driver" in err


def test_routes_need_a_pod_block_for_every_node_address(small_cluster, write_cluster):
    small_cluster["networks"]["pod"] = "10.128.0.0/20"  # 16 blocks of /24 for 256 addresses
    small_cluster["group_vars"] = {
        "all": {
            "kubernetes": {"cni": "routes", "cgroup_driver": "cgroupfs"},
            "container_runtime": {"cgroup_driver": "cgroupfs"},
        }
    }
    code, err = validate(write_cluster(small_cluster))
    assert code == 2
    assert "networks.pod" in err and "16 /24 pod blocks" in err


def test_the_certificate_upload_for_joins_reads_the_init_file():
    """A control-plane join downloads the external etcd client certificate too; kubeadm only
    uploads it when it reads the cluster's init file (its defaults know no external etcd)."""

    class First:
        name = "cp-1"
        ran: list[str] = []

        def run_shell_command(self, command, **_):
            self.ran.append(str(command))
            out = "kubeadm join api:6443 --token abcdef.0123456789abcdef "
            out += "--discovery-token-ca-cert-hash sha256:" + "b" * 64
            if "upload-certs" in str(command):
                out = "c" * 64
            return True, type("Out", (), {"stdout": out})()

    first = First()

    class State:
        inventory = type("Inventory", (), {"get_host": staticmethod(lambda name: first)})()
        active_hosts = {first}

    kube_ops.join_secrets(State(), "cp-1", True, "15m")
    upload = next(c for c in first.ran if "upload-certs" in c)
    assert f"--config {INIT_CONFIG}" in upload


def test_routes_nat_outgoing_masquerades_only_this_nodes_pods_leaving_the_pod_network(
    small_cluster, write_cluster
):
    loaded = lab_like(small_cluster, write_cluster, routes_nat_outgoing=True)
    script = files_of(loaded, "cpu-1")[POD_ROUTES_SCRIPT]
    block = pod_block(loaded.cluster, "cpu-1", 24)
    pods = loaded.cluster.networks.pod
    assert f"ip saddr {block} ip daddr != {pods} masquerade" in script
    assert "type nat hook postrouting priority srcnat" in script
    # Declared, deleted and declared again in one nft transaction: a rerun replaces the table.
    nft = script[script.index("nft -f -") :]
    assert nft.index("delete table ip gpuinfra-pod-nat") < nft.index("chain postrouting")
    assert script.count("masquerade") == 1


def test_routes_without_nat_outgoing_load_no_nft_table(small_cluster, write_cluster):
    """Turned off (a site whose routers carry the pod blocks): the script loads no nft table.
    The default masquerades, as Calico's does: CoreDNS forwards from its pod."""
    default = files_of(lab_like(small_cluster, write_cluster), "cpu-1")[POD_ROUTES_SCRIPT]
    assert "masquerade" in default
    turned_off = lab_like(small_cluster, write_cluster, routes_nat_outgoing=False)
    script = files_of(turned_off, "cpu-1")[POD_ROUTES_SCRIPT]
    assert "nft" not in script and "masquerade" not in script
    assert script.endswith("proto static\nEOF\n")


# The kubernetes role's templates the sample's settings never reach (it installs packages, runs
# Calico and has load balancers); tests/unit/test_render.py counts on this test rendering them.
OTHER_SETTINGS_TEMPLATES = {
    "kubernetes/kubelet.service.j2",
    "kubernetes/10-kubeadm.conf.j2",
    "kubernetes/api-proxy.cfg.j2",
    "kubernetes/kube-api-proxy.service.j2",
    "kubernetes/gpuinfra-pod-routes.j2",
    "kubernetes/gpuinfra-pod-routes.service.j2",
}


def test_the_lab_settings_render_the_templates_the_sample_does_not(small_cluster, write_cluster):
    """Release binaries, the routed CNI (with NAT) and no load balancer: every template that only
    these settings use is rendered under StrictUndefined."""
    del small_cluster["hosts"]["lb-1"]
    pinned = {name: "a" * 64 for name in (*kube_ops.PACKAGES, "crictl", "cni-plugins")}
    loaded = lab_like(
        small_cluster,
        write_cluster,
        source="binaries",
        binary_sha256=pinned,
        routes_nat_outgoing=True,
    )
    environment.cache_clear()
    for ctx in host_contexts(loaded):
        host_files(ctx)
    used = {key[1] for key in environment().cache}
    assert used >= OTHER_SETTINGS_TEMPLATES
    script = files_of(loaded, "cp-1")[POD_ROUTES_SCRIPT]
    assert "masquerade" in script
