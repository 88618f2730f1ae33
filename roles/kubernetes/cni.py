"""The pod network, one of two CNIs (the role's `cni`): Calico with BGP and no encapsulation
(its IPPool and BGPConfiguration, the calico-config ConfigMap of the upstream manifest, and at
the fleet's size Typha and route reflectors, inventory/sizing.py), or
`routes`, the reference bridge plugin on each node's own pod block and a static route to every
other node's block."""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from inventory.model import LoadedCluster
from inventory.sizing import cluster_sizing, explicit_or
from inventory.topology import pod_block
from roles.kubernetes import models as m
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.settings import CONFIG_DIR, cluster_settings, kubernetes_nodes
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

# ---------------------------------------------------------------- cni: calico

MANIFESTS_DIR = f"{CONFIG_DIR}/manifests"
CALICO_RESOURCES = f"{MANIFESTS_DIR}/calico-resources.yaml"
CALICO_CONFIG = f"{MANIFESTS_DIR}/calico-config.yaml"
# Calico's objects under _cluster/: applied by the Calico step, not with the other cluster
# objects (its IPPool and BGPConfiguration need the CRDs of the upstream manifest).
CALICO_PREFIX = "kubernetes/calico/"
CALICO_CONFIG_MANIFEST = f"{CALICO_PREFIX}calico-config.yaml"
CALICO_RESOURCES_MANIFEST = f"{CALICO_PREFIX}calico-resources.yaml"


# The route reflectors (the control-plane nodes, when the full mesh is off) carry this label,
# which the BGPPeer selects, and Calico's cluster ID annotation, which makes them reflect.
ROUTE_REFLECTOR_LABEL = "gpuinfra.io/route-reflector"
ROUTE_REFLECTOR_ANNOTATION = "projectcalico.org/RouteReflectorClusterID"
ROUTE_REFLECTOR_PEER = "gpuinfra-route-reflectors"


@dataclass(frozen=True)
class CalicoScale:
    """What the fleet's size decides of Calico (inventory/sizing.py), unless the inventory
    sets it: the full BGP mesh or route reflectors, and Typha's replicas (0: none)."""

    node_mesh: bool
    typha_replicas: int

    @property
    def manifest(self) -> str:
        """The upstream manifest: with Typha, its own variant."""
        return "calico-typha.yaml" if self.typha_replicas else "calico.yaml"


def calico_scale(loaded: LoadedCluster, cfg: KubernetesConfig) -> CalicoScale:
    fleet = cluster_sizing(loaded.cluster)
    return CalicoScale(
        node_mesh=explicit_or(cfg.calico_node_mesh, fleet.calico_node_mesh),
        typha_replicas=explicit_or(cfg.calico_typha_replicas, fleet.calico_typha_replicas),
    )


def route_reflectors(loaded: LoadedCluster, cfg: KubernetesConfig) -> list[str]:
    """The nodes that reflect routes: the control-plane nodes, once the mesh is off."""
    if cfg.cni != "calico" or calico_scale(loaded, cfg).node_mesh:
        return []
    return list(loaded.cluster.in_group("control_plane"))


def calico_resources(loaded: LoadedCluster, cfg: KubernetesConfig) -> list[m.Strict]:
    cluster = loaded.cluster
    scale = calico_scale(loaded, cfg)
    peers: list[m.Strict] = []
    if not scale.node_mesh:
        peers.append(
            m.BGPPeer(
                metadata=m.ObjectMeta(name=ROUTE_REFLECTOR_PEER),
                spec=m.BGPPeerSpec(
                    nodeSelector="all()", peerSelector=f"{ROUTE_REFLECTOR_LABEL} == 'true'"
                ),
            )
        )
    return [
        m.IPPool(
            metadata=m.ObjectMeta(name="default-ipv4-ippool"),
            spec=m.IPPoolSpec(
                cidr=str(cluster.networks.pod),
                blockSize=cfg.calico_block_size,
                natOutgoing=cfg.calico_nat_outgoing,
            ),
        ),
        m.BGPConfiguration(
            metadata=m.ObjectMeta(name="default"),
            spec=m.BGPConfigurationSpec(
                nodeToNodeMeshEnabled=scale.node_mesh, asNumber=cfg.calico_as_number
            ),
        ),
        *peers,
    ]


# The portmap plugin of both chains: pods' hostPorts as DNAT on the node's addresses, SNAT
# for a connection from the node itself (Calico's chain keeps the plugin's iptables backend).
PORTMAP = {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}}


def calico_config_map(loaded: LoadedCluster, cfg: KubernetesConfig) -> str:
    """The calico-config ConfigMap of the upstream manifest, as this role sets it: the BIRD BGP
    backend (no VXLAN-only mode), MTU 0 (Calico detects the node's own; no overlay header), and
    calico-node's watches through Typha's Service from 50 nodes (calico-typha.yaml)."""
    typha = "calico-typha" if calico_scale(loaded, cfg).typha_replicas else "none"
    cni = {
        "name": "k8s-pod-network",
        "cniVersion": "0.3.1",
        "plugins": [
            {
                "type": "calico",
                "log_level": "info",
                "datastore_type": "kubernetes",
                "nodename": "__KUBERNETES_NODE_NAME__",
                "mtu": "__CNI_MTU__",
                "ipam": {"type": "calico-ipam"},
                "policy": {"type": "k8s"},
                "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
            },
            PORTMAP,
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        ],
    }

    document = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "calico-config", "namespace": "kube-system"},
        "data": {
            "typha_service_name": typha,
            "calico_backend": "bird",
            "veth_mtu": "0",
            "cni_network_config": json.dumps(cni, indent=2),
        },
    }
    header = f"# Managed by gpuinfra: Calico {cfg.calico_version}, BGP, no encapsulation.\n"
    return header + yaml.safe_dump(document, sort_keys=False, width=1000)


def calico_resources_text(loaded: LoadedCluster, cfg: KubernetesConfig) -> str:
    header = (
        f"# Managed by gpuinfra: Calico {cfg.calico_version} pool and BGP settings: pod CIDR "
        "routed natively (ipipMode/vxlanMode Never).\n"
    )
    return m.dump(calico_resources(loaded, cfg), header)


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    """The Calico objects this role sets, under _cluster/ (also on every control-plane node)."""
    if not loaded.cluster.in_group("control_plane"):
        return {}
    cfg = cluster_settings(loaded)
    if not cfg.enabled or cfg.cni != "calico":
        return {}
    return {
        CALICO_CONFIG_MANIFEST: calico_config_map(loaded, cfg),
        CALICO_RESOURCES_MANIFEST: calico_resources_text(loaded, cfg),
    }


def calico_files(ctx: HostContext, cfg: KubernetesConfig) -> list[ManagedFile]:
    """The same objects on each control-plane node, for the Calico step to apply."""
    return [
        ManagedFile("kubernetes", CALICO_RESOURCES, calico_resources_text(ctx.loaded, cfg)),
        ManagedFile("kubernetes", CALICO_CONFIG, calico_config_map(ctx.loaded, cfg)),
    ]


# ---------------------------------------------------------------- cni: routes

CNI_CONFIG = "/etc/cni/net.d/10-gpuinfra.conflist"
POD_ROUTES_SCRIPT = "/usr/local/sbin/gpuinfra-pod-routes"
POD_ROUTES_UNIT = "/etc/systemd/system/gpuinfra-pod-routes.service"
POD_BRIDGE = "cni0"
POD_NAT_TABLE = "gpuinfra-pod-nat"
ROUTES_PORTMAP = {**PORTMAP, "backend": "nftables"}


def cni_config(ctx: HostContext, cfg: KubernetesConfig) -> str:
    """The reference bridge plugin with host-local addresses from this node's block. No IP
    masquerade: pod traffic keeps its address inside the cluster, answered over the routes.
    Then portmap, as in Calico's chain: a pod's hostPort (kubelet hands the mappings to the
    CNI, none of its own) is DNAT on the node's addresses, in an nftables table of its own
    (the hosts' firewall is nftables; the plugin's iptables backend needs a binary they lack),
    with SNAT for a connection from the node itself."""
    block = pod_block(ctx.cluster, ctx.name, cfg.routes_block_prefix)
    document = {
        "cniVersion": "1.0.0",
        "name": "gpuinfra",
        "plugins": [
            {
                "type": "bridge",
                "bridge": POD_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(block)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            ROUTES_PORTMAP,
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def pod_routes_script(ctx: HostContext, cfg: KubernetesConfig) -> str:
    """Replace the node's static routes into the pod network with one per other node, in one
    `ip -batch` (no window without routes); the local block stays on the bridge. With
    routes_nat_outgoing, the pods' traffic leaving the pod network is masqueraded."""
    cluster = ctx.cluster
    routes = [
        (pod_block(cluster, name, cfg.routes_block_prefix), cluster.hosts[name].address)
        for name in kubernetes_nodes(cluster)
        if name != ctx.name
    ]
    nat_block = (
        pod_block(cluster, ctx.name, cfg.routes_block_prefix) if cfg.routes_nat_outgoing else None
    )
    return render_template(
        "kubernetes/gpuinfra-pod-routes.j2",
        node=ctx.name,
        pod_network=cluster.networks.pod,
        routes=routes,
        nat_block=nat_block,
        nat_table=POD_NAT_TABLE,
    )


def routes_files(ctx: HostContext, cfg: KubernetesConfig) -> list[ManagedFile]:
    unit = render_template("kubernetes/gpuinfra-pod-routes.service.j2", script=POD_ROUTES_SCRIPT)
    return [
        ManagedFile("kubernetes", CNI_CONFIG, cni_config(ctx, cfg)),
        ManagedFile("kubernetes", POD_ROUTES_SCRIPT, pod_routes_script(ctx, cfg), mode="0755"),
        ManagedFile("kubernetes", POD_ROUTES_UNIT, unit),
    ]
