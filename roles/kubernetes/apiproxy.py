"""The node-local API proxy: where there are several API servers and no load-balancer nodes,
every node runs HAProxy on its loopback address in front of every API server (Kubespray's
default), and kubelet and kubeadm dial that."""

from __future__ import annotations

from inventory.model import Cluster
from roles.kubernetes.settings import CONFIG_DIR, settings
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

API_PROXY_CONFIG = f"{CONFIG_DIR}/api-proxy.cfg"
API_PROXY_UNIT = "/etc/systemd/system/kube-api-proxy.service"


def node_local_balancing(cluster: Cluster) -> bool:
    """Several API servers and no load-balancer nodes: every node runs its own small proxy in
    front of every API server (Kubespray's default), so losing one API server loses nothing."""
    return len(cluster.in_group("control_plane")) > 1 and not cluster.in_group("loadbalancer")


def api_endpoint(ctx: HostContext) -> str:
    """What nodes dial: api.<domain>:<port> (the VIP, a balancer or the only API server behind
    it), or the node-local proxy on the loopback address where there is no balancer."""
    if node_local_balancing(ctx.cluster):
        return f"127.0.0.1:{settings(ctx).node_local_lb_port}"
    return ctx.topology.api_endpoint


def proxy_files(ctx: HostContext) -> list[ManagedFile]:
    """HAProxy's configuration (checked with `haproxy -c` before it is written) and its unit."""
    config = render_template(
        "kubernetes/api-proxy.cfg.j2",
        port=settings(ctx).node_local_lb_port,
        backends=ctx.topology.api_backends,
    )
    unit = render_template("kubernetes/kube-api-proxy.service.j2", config=API_PROXY_CONFIG)
    return [
        ManagedFile("kubernetes", API_PROXY_CONFIG, config, check="haproxy -c -q -f {path}"),
        ManagedFile("kubernetes", API_PROXY_UNIT, unit),
    ]
