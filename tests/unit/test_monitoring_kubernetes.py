"""Prometheus' view of the Kubernetes cluster, offline: what the kubernetes role offers to
scrape (roles/kubernetes/metrics.py), the scrape jobs and their TLS, Prometheus' client
certificate (roles/monitoring/kubernetes.py: its key, its request, when a kept one still
serves), the kubelets' RBAC, the listeners and firewall rules of the scheduler and the
controller manager."""

from __future__ import annotations

import base64
import datetime
import functools

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from engine.context import cluster_files, host_contexts, load
from roles.kubernetes.kubeadm import controller_manager_flags, scheduler_flags
from roles.kubernetes.metrics import OPERATOR_KUBECONFIG, metrics_access
from roles.kubernetes.settings import settings
from roles.monitoring import kubernetes as creds
from roles.monitoring.files import PROMETHEUS_CONFIG
from roles.monitoring.targets import CLIENT_CERT, CLIENT_KEY, CLUSTER_CA
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE
from toolkit.nodes import SchedulerFiles

files_of = functools.partial(shared_files_of, contents=False)
NOW = datetime.datetime(2026, 12, 4, tzinfo=datetime.UTC)


def _jobs(loaded) -> dict[str, dict]:
    config = yaml.safe_load(files_of(loaded, "mon-1")[PROMETHEUS_CONFIG].content)
    return {job["job_name"]: job for job in config["scrape_configs"]}


def _targets(job: dict) -> set[str]:
    return {static["targets"][0] for static in job["static_configs"]}


def test_the_cluster_is_scraped_over_https_with_prometheus_certificate():
    loaded = load(SAMPLE)
    cluster = loaded.cluster
    jobs = _jobs(loaded)
    cp = cluster.in_group("control_plane")
    nodes = cp + cluster.in_group("gpu_worker") + cluster.in_group("cpu_worker")
    fqdn = lambda names, port: {f"{n}.sample.gpu.internal:{port}" for n in names}  # noqa: E731
    assert _targets(jobs["kubernetes-apiservers"]) == fqdn(cp, 6443)
    assert _targets(jobs["kubelet"]) == fqdn(nodes, 10250)
    assert _targets(jobs["kube-scheduler"]) == fqdn(cp, 10259)
    assert _targets(jobs["kube-controller-manager"]) == fqdn(cp, 10257)
    for name in ("kubernetes-apiservers", "kubelet", "kube-scheduler", "kube-controller-manager"):
        job = jobs[name]
        assert job["scheme"] == "https", name
        assert job["tls_config"]["cert_file"] == CLIENT_CERT
        assert job["tls_config"]["key_file"] == CLIENT_KEY
    # The API servers' certificates are the cluster CA's: checked. The others are self-signed.
    assert jobs["kubernetes-apiservers"]["tls_config"] == {
        "cert_file": CLIENT_CERT, "key_file": CLIENT_KEY, "ca_file": CLUSTER_CA
    }  # fmt: skip
    for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
        assert jobs[name]["tls_config"]["insecure_skip_verify"] is True
        assert "ca_file" not in jobs[name]["tls_config"]
    # Control: the plain exporters stay on HTTP without TLS.
    assert "scheme" not in jobs["node"] and "tls_config" not in jobs["etcd"]


def test_without_kubernetes_nothing_of_it_is_scraped_or_kept(small_cluster, load_small):
    small_cluster.setdefault("group_vars", {}).setdefault("all", {})["kubernetes"] = {
        "enabled": False
    }
    loaded = load_small()
    assert metrics_access(loaded) is None
    assert "kubelet" not in _jobs(loaded)
    assert CLIENT_KEY not in files_of(loaded, "mon-1")
    assert creds.KUBELET_METRICS_OBJECTS not in cluster_files(loaded)
    assert not (loaded.state_dir / creds.KEY_STATE).exists()


def test_the_key_is_a_kept_secret_and_the_certificate_waits_for_its_signature(loaded):
    files = files_of(loaded, "mon-1")
    key = files[CLIENT_KEY]
    assert (key.secret, key.mode, key.group) == (True, "0640", "prometheus")
    assert (loaded.state_dir / creds.KEY_STATE).read_text().strip() == key.content.strip()
    assert (loaded.state_dir / creds.KEY_STATE).stat().st_mode & 0o777 == 0o600
    # No certificate kept yet: the apply signs one (an operation), nothing is rendered for it.
    assert CLIENT_CERT not in files and CLUSTER_CA not in files


def test_a_read_only_load_makes_no_key(load_small):
    from inventory.model import StateAccess

    loaded = load_small().with_state_access(StateAccess.existing)
    assert files_of(loaded, "mon-1")[CLIENT_KEY].content.startswith("PLACEHOLDER")
    assert not (loaded.state_dir / creds.KEY_STATE).exists()


def test_the_request_names_prometheus_in_system_monitoring():
    key = creds.new_key()
    request = x509.load_pem_x509_csr(creds.request_pem(key).encode())
    assert request.is_signature_valid
    assert request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == creds.USER
    assert (
        request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
        == "system:monitoring"
    )
    command = creds.signing_command(creds.request_pem(key), "/etc/kubernetes/admin.conf")
    # The request is public and may be on the command line; the key never is.
    for line in key.splitlines()[1:-1]:
        assert line not in command
    assert "kubernetes.io/kube-apiserver-client" in command
    assert "certificate approve" in command and command.count("delete csr") == 3


def _ca(name: str = "kubernetes") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _signed(ca, client_key_pem: str, days: int) -> str:
    ca_key, ca_cert = ca
    request = x509.load_pem_x509_csr(creds.request_pem(client_key_pem).encode())
    cert = (
        x509.CertificateBuilder()
        .subject_name(request.subject)
        .issuer_name(ca_cert.subject)
        .public_key(request.public_key())
        .serial_number(2)
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=days))
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _keep(loaded, cert_pem: str, ca_pem: str, operator_ca: str | None = None) -> None:
    for relative, text in ((creds.CERT_STATE, cert_pem), (creds.CA_STATE, ca_pem)):
        (loaded.state_dir / relative).write_text(text)
    if operator_ca is not None:
        conf = {
            "clusters": [
                {
                    "cluster": {
                        "certificate-authority-data": base64.b64encode(
                            operator_ca.encode()
                        ).decode()
                    }
                }
            ]
        }
        path = loaded.state_dir / OPERATOR_KUBECONFIG
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(conf))


def test_a_kept_certificate_is_written_while_it_serves(loaded):
    key = creds.client_key(loaded)
    ca = _ca()
    _keep(loaded, _signed(ca, key, 365), _pem(ca[1]), operator_ca=_pem(ca[1]))
    assert creds.current_certificate(loaded, key, NOW) is not None
    files = files_of(loaded, "mon-1")
    assert files[CLIENT_CERT].content == (loaded.state_dir / creds.CERT_STATE).read_text()
    assert files[CLUSTER_CA].content == _pem(ca[1])
    assert (files[CLIENT_CERT].secret, files[CLIENT_CERT].mode) == (False, "0644")


@pytest.mark.parametrize(
    "why", ["near its end", "another key", "another CA", "the cluster made again"]
)
def test_a_kept_certificate_that_no_longer_serves_is_signed_again(loaded, why):
    key = creds.client_key(loaded)
    ca = _ca()
    cert, ca_pem, operator = _signed(ca, key, 365), _pem(ca[1]), None
    if why == "near its end":
        cert = _signed(ca, key, 29)
    elif why == "another key":
        cert = _signed(ca, creds.new_key(), 365)
    elif why == "another CA":
        ca_pem = _pem(_ca()[1])
    else:
        operator = _pem(_ca()[1])  # admin.conf now names a new cluster CA
    _keep(loaded, cert, ca_pem, operator)
    assert creds.current_certificate(loaded, key, NOW) is None
    # Control: the same kept files, nothing changed, serve.
    _keep(loaded, _signed(ca, key, 365), _pem(ca[1]), _pem(ca[1]))
    assert creds.current_certificate(loaded, key, NOW) is not None


def test_kubelets_let_prometheus_user_read_their_metrics_only(loaded):
    text = cluster_files(loaded)[creds.KUBELET_METRICS_OBJECTS]
    role, binding = yaml.safe_load_all(text)
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gpuinfra:prometheus"}
    ]


def _flags(loaded) -> dict[str, dict[str, str]]:
    ctx = next(c for c in host_contexts(loaded) if c.name == "cp-1")
    cfg = settings(ctx)
    scheduler = SchedulerFiles("/x", "", {}, {}, {})
    return {
        "scheduler": {f.name: f.value for f in scheduler_flags(ctx, scheduler)},
        "controller-manager": {f.name: f.value for f in controller_manager_flags(ctx, cfg)},
    }


def test_the_scheduler_and_controller_manager_listen_for_monitoring_only(
    small_cluster, write_cluster
):
    from engine.context import load as load_cluster
    from inventory.topology import KUBE_CONTROLLER_MANAGER_PORT, KUBE_SCHEDULER_PORT
    from roles.kubernetes.role import ports

    loaded = load_cluster(write_cluster(small_cluster))
    for flags in _flags(loaded).values():
        assert flags["bind-address"] == "0.0.0.0"
    rules = {rule.port: rule for rule in ports(loaded)["control_plane"]}
    mon = str(loaded.cluster.hosts["mon-1"].address)
    for port in (KUBE_SCHEDULER_PORT, KUBE_CONTROLLER_MANAGER_PORT):
        assert rules[port].sources == (f"{mon}/32",) or rules[port].sources == (mon,)
    # Control: without a monitoring host, kubeadm's 127.0.0.1 and no such rule.
    del small_cluster["hosts"]["mon-1"]
    loaded = load_cluster(write_cluster(small_cluster))
    for flags in _flags(loaded).values():
        assert "bind-address" not in flags
    ports_open = {rule.port for rule in ports(loaded)["control_plane"]}
    assert not ports_open & {KUBE_SCHEDULER_PORT, KUBE_CONTROLLER_MANAGER_PORT}


def test_the_key_file_is_the_same_when_made_and_when_read_back(load_small):
    """kept_secret returns a new secret as made and a kept one stripped: the file must not
    differ between the apply that makes the key and the next (found by the engines' test)."""
    made = files_of(load_small(), "mon-1")[CLIENT_KEY].content
    again = files_of(load_small(), "mon-1")[CLIENT_KEY].content
    assert made == again and made.endswith("-----\n") and not made.endswith("\n\n")
