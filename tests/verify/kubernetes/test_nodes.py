"""The kubernetes role, checked on every node after a bootstrap: kubelet runs and reads the
settings we render, the kubelet's static pod folder holds only what kubeadm puts there (a
manifest dropped in runs with the node's rights), the pod network's configuration is in place,
and no certificate the node uses is near its expiry."""

from __future__ import annotations

import json
import shlex

import yaml

from engine.context import host_files

# kubernetes.enabled: false installs nothing: such hosts are no targets (tests/verify/conftest.py).
ONLY_WHERE_ENABLED = True

# kubeadm's own paths (kubeadm's constants): the kubelet's configuration as kubeadm wrote it
# (the cluster's KubeletConfiguration with this node's patches merged in), and its static pods.
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
STATIC_PODS = "/etc/kubernetes/manifests"
# With an external etcd kubeadm writes these three on a control-plane node, none on a worker.
CONTROL_PLANE_PODS = ("kube-apiserver.yaml", "kube-controller-manager.yaml", "kube-scheduler.yaml")
CNI_DIR = "/etc/cni/net.d"
# An operator wants a month to plan a renewal; kubeadm's leaf certificates last a year.
EXPIRY_MARGIN_S = 30 * 24 * 3600


def rendered(ctx, suffix: str) -> str | None:
    """The content the kubernetes role renders for this host at a path ending in suffix."""
    for managed in host_files(ctx, ["kubernetes"]):
        if managed.path.endswith(suffix):
            return managed.content
    return None


def holds(live: object, wanted: object) -> bool:
    """Whether the live value carries the wanted one: a merge patch's map may meet keys of the
    cluster's own configuration, which stay beside it."""
    if isinstance(wanted, dict) and isinstance(live, dict):
        return all(holds(live.get(key), value) for key, value in wanted.items())
    return live == wanted


def test_kubelet_runs_and_starts_at_boot(host) -> None:
    service = host.service("kubelet")
    assert service.is_running and service.is_enabled


def test_kubelet_reads_the_rendered_node_settings(host, ctx) -> None:
    """Every key of this node's kubelet patch is what the kubelet's configuration holds: the
    per-group reserved resources, eviction thresholds and max pods were not lost on the way."""
    patch_text = rendered(ctx, "patches/kubeletconfiguration+merge.yaml")
    assert patch_text is not None, "the kubernetes role renders no kubelet patch for this node"
    patch = yaml.safe_load(patch_text)
    live = yaml.safe_load(host.file(KUBELET_CONFIG).content_string)
    differing = {
        key: (value, live.get(key))
        for key, value in patch.items()
        if key not in ("apiVersion", "kind") and not holds(live.get(key), value)
    }
    assert not differing, f"{KUBELET_CONFIG} differs from the rendered patch: {differing}"


def test_static_pods_are_only_kubeadms(host, ctx) -> None:
    listing = host.check_output(f"ls -1A {STATIC_PODS} 2>/dev/null || true")
    present = sorted(name for name in listing.splitlines() if name)
    expected = sorted(CONTROL_PLANE_PODS) if "control_plane" in ctx.host.groups else []
    assert present == expected, f"{STATIC_PODS} holds {present}, expected {expected}"


def test_pod_network_configuration_is_in_place(host, ctx) -> None:
    """The first configuration in CNI's folder (the one the runtime uses) is a valid conflist:
    ours where the role renders it (cni: routes), Calico's where Calico writes it."""
    listing = host.check_output(f"ls -1 {CNI_DIR} 2>/dev/null || true")
    configs = sorted(n for n in listing.splitlines() if n.endswith((".conf", ".conflist")))
    assert configs, f"{CNI_DIR} holds no network configuration: the node stays NotReady"
    first = f"{CNI_DIR}/{configs[0]}"
    ours = next(
        (f for f in host_files(ctx, ["kubernetes"]) if f.path.startswith(f"{CNI_DIR}/")), None
    )
    if ours is not None:
        assert first == ours.path, f"{first} comes before the rendered {ours.path}"
    document = json.loads(host.file(first).content_string)
    assert document.get("plugins"), f"{first} names no plugin"


def test_certificates_are_not_near_expiry(host) -> None:
    """Every certificate under /etc/kubernetes/pki and the kubelet's client and serving
    certificates stay valid for at least EXPIRY_MARGIN_S more."""
    found = host.check_output(
        "find /etc/kubernetes/pki /var/lib/kubelet/pki -name '*.crt' -o -name '*-current.pem' "
        "2>/dev/null || true"
    )
    certificates = sorted(set(found.split()))
    assert certificates, "no certificate found under /etc/kubernetes/pki or /var/lib/kubelet/pki"
    expiring = [
        path
        for path in certificates
        if host.run(f"openssl x509 -checkend {EXPIRY_MARGIN_S} -noout -in {shlex.quote(path)}").rc
        != 0
    ]
    assert not expiring, f"valid for less than 30 days: {expiring}"
