"""What the kubernetes role offers Prometheus: every API server, every node's kubelet, and each
control-plane node's kube-scheduler and kube-controller-manager, each serving /metrics over TLS
to a client certificate of the cluster's CA. The monitoring role (roles/monitoring/kubernetes.py)
has one signed for itself through the cluster's certificates API, in the group
`system:monitoring`, which Kubernetes' own `system:monitoring` role lets read /metrics on the
API servers, the scheduler and the controller manager; kubelets authorise `nodes/metrics`,
which monitoring's cluster objects grant."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import yaml

from inventory.model import LoadedCluster
from inventory.topology import (
    KUBE_CONTROLLER_MANAGER_PORT,
    KUBE_SCHEDULER_PORT,
    KUBELET_PORT,
)
from roles.kubernetes.kubeadm import ADMIN_CONF, APISERVER_PKI
from roles.kubernetes.settings import cluster_settings, kubernetes_nodes

# The cluster CA's certificate on every node (kubeadm's); what the API servers' own
# certificates are signed with, so Prometheus checks them against it.
CLUSTER_CA = f"{APISERVER_PKI}/ca.crt"
# The controller's copy of it, under the cluster's state (roles/kubernetes/deploy.py).
OPERATOR_KUBECONFIG = "kubernetes/admin.conf"


@dataclass(frozen=True)
class MetricsEndpoint:
    job: str  # Prometheus' job name
    hosts: tuple[str, ...]  # inventory names, dialled by FQDN
    port: int
    # Whether the serving certificate is the cluster CA's (the API servers' carry every
    # control-plane node's FQDN, roles/kubernetes/kubeadm.py cert_sans). kubelet's, the
    # scheduler's and the controller manager's are self-signed by each process at start.
    ca_signed: bool


@dataclass(frozen=True)
class MetricsAccess:
    signer: str  # the first control-plane node, where the certificate request is approved
    admin_kubeconfig: str  # there, kubeadm's admin.conf, which may approve it
    cluster_ca: str
    endpoints: tuple[MetricsEndpoint, ...]
    # The cluster CA's certificate (PEM) as the controller's copy of admin.conf holds it,
    # copied at the last apply; None before the first: a certificate Prometheus holds from
    # another CA (the cluster made again) is signed anew.
    operator_ca: str | None = None


def metrics_access(loaded: LoadedCluster) -> MetricsAccess | None:
    """The endpoints to scrape and where the credentials come from; None when the inventory
    runs no Kubernetes."""
    cluster = loaded.cluster
    control_plane = tuple(cluster.in_group("control_plane"))
    if not control_plane or not cluster_settings(loaded).enabled:
        return None
    return MetricsAccess(
        signer=control_plane[0],
        admin_kubeconfig=ADMIN_CONF,
        cluster_ca=CLUSTER_CA,
        endpoints=(
            MetricsEndpoint("kubernetes-apiservers", control_plane, cluster.api.port, True),
            MetricsEndpoint("kubelet", tuple(kubernetes_nodes(cluster)), KUBELET_PORT, False),
            MetricsEndpoint("kube-scheduler", control_plane, KUBE_SCHEDULER_PORT, False),
            MetricsEndpoint(
                "kube-controller-manager", control_plane, KUBE_CONTROLLER_MANAGER_PORT, False
            ),
        ),
        operator_ca=operator_ca(loaded),
    )


def operator_ca(loaded: LoadedCluster) -> str | None:
    """The CA certificate in the controller's admin.conf, or None where there is none (yet)."""
    try:
        config = yaml.safe_load((loaded.state_dir / OPERATOR_KUBECONFIG).read_text())
        data = config["clusters"][0]["cluster"]["certificate-authority-data"]
        return base64.b64decode(data, validate=True).decode()
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, binascii.Error):
        return None
