"""The kubernetes role on the control-plane nodes: each API server runs with the flags the
role renders into kubeadm's ClusterConfiguration."""

from __future__ import annotations

import yaml

from engine.context import host_context
from tests.verify.kubernetes.test_nodes import STATIC_PODS, rendered

TARGET_GROUPS = ("control_plane",)
# kubernetes.enabled: false installs nothing: such hosts are no targets (tests/verify/conftest.py).
ONLY_WHERE_ENABLED = True


def test_api_server_runs_with_the_rendered_flags(host, ctx) -> None:
    first = host_context(ctx.loaded, ctx.cluster.in_group("control_plane")[0], ctx.topology)
    documents = yaml.safe_load_all(rendered(first, "gpuinfra/kubeadm.yaml") or "")
    cluster = next(d for d in documents if d and d.get("kind") == "ClusterConfiguration")
    manifest = yaml.safe_load(host.file(f"{STATIC_PODS}/kube-apiserver.yaml").content_string)
    command = manifest["spec"]["containers"][0]["command"]
    missing = [
        f"--{arg['name']}={arg['value']}"
        for arg in cluster["apiServer"].get("extraArgs", [])
        if f"--{arg['name']}={arg['value']}" not in command
    ]
    assert not missing, f"kube-apiserver runs without {missing}"
