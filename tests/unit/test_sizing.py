"""Settings sized from the inventory's node count (inventory/sizing.py): the figures at four
fleet sizes, their floors and ceilings, and the roles rendering them unless the inventory sets
the key."""

from __future__ import annotations

import ipaddress

import pytest
import yaml

from engine.context import host_contexts, load
from inventory.model import Cluster
from inventory.sizing import GIB, Sizing, explicit_or, kubernetes_nodes, sizing
from roles.etcd.files import UNIT
from roles.kubernetes.cni import (
    CALICO_CONFIG,
    CALICO_RESOURCES,
    CalicoScale,
    calico_scale,
    route_reflectors,
)
from roles.kubernetes.coredns import COREDNS_PATCH
from roles.kubernetes.kubeadm import INIT_CONFIG, node_labels
from roles.kubernetes.schemas import validate_text
from roles.kubernetes.settings import cluster_settings
from roles.monitoring.files import PROMETHEUS_CONFIG
from tests.helpers import files_of


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        # A lab or the sample: every figure at its floor, no Typha, Calico's full mesh.
        (5, Sizing(5, 400, 200, 2 * GIB, 2, 15, 0, True)),
        # Typha from 50 nodes, three replicas at least; the mesh up to 100 nodes.
        (50, Sizing(50, 400, 200, 2 * GIB, 4, 15, 3, True)),
        (101, Sizing(101, 400, 200, 2 * GIB, 7, 15, 3, False)),
        # Upstream's slots still (0.6 x 500 = 300 < 400), 32 CoreDNS replicas, route reflectors.
        (500, Sizing(500, 400, 200, 2 * GIB, 32, 15, 3, False)),
        # 1,500/500 as large clusters run them; 5,000 MiB of etcd rounds up to 5 GiB; 50 s of
        # scrape budget rounds up to 60 s; a Typha replica per 200 nodes.
        (2500, Sizing(2500, 1500, 500, 5 * GIB, 157, 60, 13, False)),
        # Every ceiling: 3,000/1,000 slots, etcd's 8 GiB maximum, 60 s scrapes, 20 Typhas.
        (7500, Sizing(7500, 3000, 1000, 8 * GIB, 469, 60, 20, False)),
    ],
)
def test_the_figures_at_each_fleet_size(nodes, expected):
    assert sizing(nodes) == expected


@pytest.mark.parametrize("nodes", [0, 1, 2])
def test_a_tiny_fleet_keeps_the_floors(nodes):
    figures = sizing(nodes)
    assert (figures.max_requests_inflight, figures.max_mutating_requests_inflight) == (400, 200)
    assert figures.etcd_quota_backend_bytes == 2 * GIB  # etcd's own default
    assert figures.coredns_replicas == 2  # never a single CoreDNS
    assert figures.scrape_interval_s == 15


def test_the_ceilings_hold_past_any_fleet():
    figures = sizing(100_000)
    assert (figures.max_requests_inflight, figures.max_mutating_requests_inflight) == (3000, 1000)
    assert figures.etcd_quota_backend_bytes == 8 * GIB
    assert figures.scrape_interval_s == 60


def test_each_figure_grows_with_the_fleet_between_its_bounds():
    # Just past each floor, the next node moves the figure.
    assert sizing(668).max_requests_inflight == 400 < sizing(669).max_requests_inflight == 401
    assert sizing(1024).etcd_quota_backend_bytes == 2 * GIB
    assert sizing(1025).etcd_quota_backend_bytes == 3 * GIB
    assert sizing(32).coredns_replicas == 2 and sizing(33).coredns_replicas == 3
    assert sizing(750).scrape_interval_s == 15 and sizing(751).scrape_interval_s == 30


def test_an_explicit_value_wins_even_when_it_is_below_the_derived_one():
    assert explicit_or(None, 3000) == 3000
    assert explicit_or(100, 3000) == 100
    assert explicit_or(0, 3000) == 0  # zero is a value (no limit), not "unset"


def test_every_host_that_joins_the_cluster_counts_once(small_cluster):
    # cp-1, cp-2, gpu-1 and cpu-1; etcd, load balancer, DNS and monitoring hosts do not join.
    assert kubernetes_nodes(Cluster.model_validate(small_cluster)) == 4
    small_cluster["hosts"]["cpu-1"]["groups"] = ["control_plane", "cpu_worker"]
    small_cluster["hosts"]["mon-1"]["groups"] = ["monitoring", "cpu_worker"]
    assert kubernetes_nodes(Cluster.model_validate(small_cluster)) == 5


WORKERS = 1100  # 1,104 nodes: past the floor of every figure but the ceilings


@pytest.fixture(scope="module")
def large_cluster(tmp_path_factory):
    from tests.unit.conftest import SMALL_CLUSTER

    data = yaml.safe_load(yaml.safe_dump(SMALL_CLUSTER))
    data["networks"]["node"] = "10.0.0.0/20"
    first = ipaddress.IPv4Address("10.0.1.0")
    for index in range(WORKERS):
        data["hosts"][f"cpu-{index + 2}"] = {
            "address": str(first + index),
            "groups": ["cpu_worker"],
        }
    return data, tmp_path_factory.mktemp("large")


def rendered(data, folder, name: str = "cluster.yml"):
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load(path)
    return {
        "kubeadm": yaml.safe_load_all(files_of(loaded, "cp-1", "kubernetes")[INIT_CONFIG]),
        "coredns": yaml.safe_load(files_of(loaded, "cp-1", "kubernetes")[COREDNS_PATCH]),
        "etcd": files_of(loaded, "etcd-1", "etcd")[UNIT],
        "prometheus": yaml.safe_load(files_of(loaded, "mon-1", "monitoring")[PROMETHEUS_CONFIG]),
        "calico": list(
            yaml.safe_load_all(files_of(loaded, "cp-1", "kubernetes")[CALICO_RESOURCES])
        ),
        "calico-config": yaml.safe_load(files_of(loaded, "cp-1", "kubernetes")[CALICO_CONFIG]),
    }


def api_server_flags(documents) -> dict[str, str]:
    cluster = next(doc for doc in documents if doc and doc["kind"] == "ClusterConfiguration")
    return {arg["name"]: arg["value"] for arg in cluster["apiServer"]["extraArgs"]}


def test_the_roles_render_what_the_node_count_derives(large_cluster):
    data, folder = large_cluster
    files = rendered(data, folder)
    flags = api_server_flags(files["kubeadm"])
    assert flags["max-requests-inflight"] == "662"  # 0.6 x 1,104
    assert flags["max-mutating-requests-inflight"] == "220"
    # No watch cache flag: the API server sizes its watch caches itself.
    assert not any("watch-cache" in name for name in flags)
    assert files["coredns"]["spec"]["replicas"] == 69  # ceil(1,104 / 16)
    spread = files["coredns"]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "kubernetes.io/hostname"
    assert spread[0]["labelSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert f"--quota-backend-bytes={3 * GIB}" in files["etcd"]  # 2,208 MiB, in whole GiB
    assert files["prometheus"]["global"]["scrape_interval"] == "30s"  # 22 s, in 15 s steps
    # Calico past 100 nodes: no full mesh, every node peering with the route reflectors (the
    # control-plane nodes, labelled at registration); Typha, ceil(1,104 / 200) replicas.
    by_kind = {doc["kind"]: doc for doc in files["calico"] if doc}
    assert by_kind["BGPConfiguration"]["spec"]["nodeToNodeMeshEnabled"] is False
    assert by_kind["BGPPeer"]["spec"] == {
        "nodeSelector": "all()",
        "peerSelector": "gpuinfra.io/route-reflector == 'true'",
    }
    assert files["calico-config"]["data"]["typha_service_name"] == "calico-typha"
    loaded = load(folder / "cluster.yml")
    cfg = cluster_settings(loaded)
    assert calico_scale(loaded, cfg) == CalicoScale(node_mesh=False, typha_replicas=6)
    assert calico_scale(loaded, cfg).manifest == "calico-typha.yaml"
    assert route_reflectors(loaded, cfg) == ["cp-1", "cp-2"]
    contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}
    for name, reflects in (("cp-1", True), ("cpu-2", False)):
        label = node_labels(contexts[name], cfg).get("gpuinfra.io/route-reflector")
        assert (label == "true") is reflects, name


def test_a_key_set_in_the_inventory_wins_over_the_derived_value(large_cluster):
    data, folder = large_cluster
    data = yaml.safe_load(yaml.safe_dump(data))
    data["group_vars"] = {
        "all": {
            "kubernetes": {
                "max_requests_inflight": 250,
                "max_mutating_requests_inflight": 125,
                "coredns_replicas": 7,
            },
            "etcd": {"quota_backend_bytes": 6 * GIB},
            "monitoring": {"scrape_interval": "10s"},
        }
    }
    files = rendered(data, folder, "explicit.yml")
    flags = api_server_flags(files["kubeadm"])
    assert (flags["max-requests-inflight"], flags["max-mutating-requests-inflight"]) == (
        "250",
        "125",
    )
    assert files["coredns"]["spec"]["replicas"] == 7
    assert f"--quota-backend-bytes={6 * GIB}" in files["etcd"]
    assert files["prometheus"]["global"]["scrape_interval"] == "10s"


def test_calico_keys_set_in_the_inventory_win_over_the_fleet_size(large_cluster):
    """A 1,104-node fleet that keeps the full mesh and runs no Typha on purpose: nothing of the
    route reflectors is rendered, and the plain manifest is the one pinned."""
    data, folder = large_cluster
    data = yaml.safe_load(yaml.safe_dump(data))
    data["group_vars"] = {
        "all": {"kubernetes": {"calico_node_mesh": True, "calico_typha_replicas": 0}}
    }
    files = rendered(data, folder, "calico-explicit.yml")
    kinds = [doc["kind"] for doc in files["calico"] if doc]
    assert "BGPPeer" not in kinds
    assert files["calico-config"]["data"]["typha_service_name"] == "none"
    loaded = load(folder / "calico-explicit.yml")
    cfg = cluster_settings(loaded)
    assert calico_scale(loaded, cfg).manifest == "calico.yaml"
    assert route_reflectors(loaded, cfg) == []


def test_the_coredns_patch_holds_only_fields_a_deployment_has(large_cluster):
    """The patch is a fragment, which no schema validates alone: laid over a whole Deployment
    like kubeadm's, it must pass the pinned version's schema (strict: a misspelt field
    fails), and it may touch nothing but the replicas and the spread."""
    data, folder = large_cluster
    patch = rendered(data, folder, "patch.yml")["coredns"]
    assert patch.keys() == {"spec"} and patch["spec"].keys() == {"replicas", "template"}
    assert patch["spec"]["template"] == {
        "spec": {"topologySpreadConstraints": patch["spec"]["template"]["spec"][
            "topologySpreadConstraints"]}
    }  # fmt: skip
    labels = {"k8s-app": "kube-dns"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system"},
        "spec": {
            "replicas": patch["spec"]["replicas"],
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "coredns", "image": "registry.k8s.io/coredns"}],
                    **patch["spec"]["template"]["spec"],
                },
            },
        },
    }
    version = Cluster.model_validate(data).versions.kubernetes
    assert validate_text(yaml.safe_dump(deployment), "coredns", version) == []
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["nodeTaintPolicy"] = "x"
    assert validate_text(yaml.safe_dump(broken), "coredns", version) != []  # the check can fail
