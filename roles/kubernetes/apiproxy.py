"""The node-local API proxy: where there are several API servers and no load-balancer nodes,
every node runs HAProxy on its loopback address in front of every API server (Kubespray's
default), and kubelet and kubeadm dial that."""

from __future__ import annotations

import math
import re

from inventory.model import Cluster
from roles.kubernetes.settings import CONFIG_DIR, settings
from toolkit.spec import HostContext, ManagedFile, settings_of
from toolkit.templates import render_template

API_PROXY_CONFIG = f"{CONFIG_DIR}/api-proxy.cfg"
API_PROXY_UNIT = "/etc/systemd/system/kube-api-proxy.service"
# The node-local proxy checks /readyz every 2 s and takes a server out after 3 failures, as the
# load balancers do by default (Kubespray's HAProxy: 3 s/3/2).
CHECK_INTERVAL_S = 2
CHECK_FALL = 3
CHECK_TIMEOUT_S = 5
# An API server whose shutdown began goes on serving this much longer than the slowest
# balancer in front of it needs to see its /readyz fail (the check's own timeout is 5 s).
SHUTDOWN_MARGIN_S = 5
_HAPROXY_TIME = re.compile(r"^(\d+)(us|ms|s|m|h|d)?$")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1, None: 1e-3, "m": 60, "h": 3600, "d": 86400}


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


def haproxy_seconds(value: str) -> float:
    """HAProxy's time format ("2s", "500ms", "1m"; a bare number is milliseconds)."""
    match = _HAPROXY_TIME.match(value.strip())
    if match is None:
        raise ValueError(f"not an HAProxy time: {value!r}")
    return int(match[1]) * _UNIT_S[match[2]]


def detection_seconds(ctx: HostContext) -> int:
    """How long the slowest balancer in front of the API servers (each load balancer by its
    own settings, or the node-local proxies) takes to see a /readyz fail: interval x fall,
    plus the check's timeout."""
    found = [CHECK_INTERVAL_S * CHECK_FALL + CHECK_TIMEOUT_S]
    for name in ctx.cluster.in_group("loadbalancer"):
        cfg = settings_of(ctx.loaded, name, "loadbalancer")
        found.append(
            haproxy_seconds(cfg.check_interval) * cfg.check_fall
            + haproxy_seconds(cfg.connect_timeout)
        )
    return math.ceil(max(found))


def proxy_files(ctx: HostContext) -> list[ManagedFile]:
    """HAProxy's configuration (checked with `haproxy -c` before it is written) and its unit."""
    config = render_template(
        "kubernetes/api-proxy.cfg.j2",
        port=settings(ctx).node_local_lb_port,
        backends=ctx.topology.api_backends,
        check_interval_s=CHECK_INTERVAL_S,
        check_fall=CHECK_FALL,
        check_timeout_s=CHECK_TIMEOUT_S,
    )
    unit = render_template("kubernetes/kube-api-proxy.service.j2", config=API_PROXY_CONFIG)
    return [
        ManagedFile("kubernetes", API_PROXY_CONFIG, config, check="haproxy -c -q -f {path}"),
        ManagedFile("kubernetes", API_PROXY_UNIT, unit),
    ]
