"""Prometheus' credentials for the Kubernetes cluster (what roles/kubernetes/metrics.py offers):
a client certificate of the cluster's CA for the user `gpuinfra:prometheus` in the group
`system:monitoring`.

- Its key is made on the controller and kept in the cluster's state (0600), written to the
  monitoring hosts like any managed secret (0640, group prometheus), never on a command line.
- Its certificate is signed through the certificates API (signer
  kubernetes.io/kube-apiserver-client) on the first control-plane node: the request (public)
  is created and approved there with kubeadm's admin.conf, and the certificate read back and
  the request deleted. The certificate and the cluster CA's are kept in the state beside the
  key, so every later apply writes all three as managed files and drift checks them. The
  first apply has no certificate when it prepares, so an operation signs and writes it at its
  run, after the kubernetes role has made the cluster; so does an apply that finds the kept
  certificate within RENEW_S of its end, for another key, or of another CA than the
  controller's admin.conf names (the cluster made again).
- Kubernetes' own `system:monitoring` role lets that group read /metrics on the API servers,
  the scheduler and the controller manager; kubelets authorise `nodes/metrics`, granted to the
  user by `cluster_objects`.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import shlex

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from inventory.model import LoadedCluster, StateAccess
from roles.monitoring.targets import CLIENT_CERT, CLIENT_KEY, CLUSTER_CA
from toolkit import clock
from toolkit.spec import ManagedFile, provided
from toolkit.statefiles import PLACEHOLDER, kept_secret

# The cluster's metrics endpoints and where Prometheus' certificate is signed (kubernetes).
metrics_access = provided("kubernetes", "metrics_access")

USER = "gpuinfra:prometheus"
GROUP = "system:monitoring"
KEY_STATE = "monitoring/kubernetes-client.key"
CERT_STATE = "monitoring/kubernetes-client.crt"
CA_STATE = "monitoring/kubernetes-ca.crt"
# A year: kube-controller-manager's longest signature by default (--cluster-signing-duration).
CERT_S = 365 * 86400
# An apply within 30 days of the end signs a new one: a monthly apply never lets it lapse.
RENEW_S = 30 * 86400
SIGNER = "kubernetes.io/kube-apiserver-client"
KUBELET_METRICS_ROLE = "gpuinfra:kubelet-metrics"
KUBELET_METRICS_OBJECTS = "kubernetes/monitoring-kubelet-metrics.yaml"
SIGN_WAIT_S = 60


def new_key() -> str:
    """A P-256 key in PEM, without its last newline (as kept_secret reads every secret back)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return (
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
        .strip()
    )


def client_key(loaded: LoadedCluster) -> str:
    """The key, kept in the state (made by an apply; a read-only command writes nothing and
    renders the placeholder where there is none yet)."""
    access = loaded.state_access
    if access is StateAccess.existing:
        access = StateAccess.placeholder
    return kept_secret(loaded.state_dir, KEY_STATE, new_key, access)


def request_pem(key_pem: str) -> str:
    """The certificate request for USER in GROUP, signed with the key."""
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, USER),
        ]
    )
    request = (
        x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM).decode()


def public_key(pem_key_or_cert: x509.Certificate | str) -> bytes:
    if isinstance(pem_key_or_cert, x509.Certificate):
        public = pem_key_or_cert.public_key()
    else:
        public = serialization.load_pem_private_key(
            pem_key_or_cert.encode(), password=None
        ).public_key()
    return public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def current_certificate(
    loaded: LoadedCluster, key_pem: str, now: datetime.datetime | None = None
) -> tuple[str, str] | None:
    """The kept certificate and CA, when they still serve: the key's, more than RENEW_S from
    their end, and of the CA the controller's admin.conf names (where it has one)."""
    access = metrics_access(loaded)
    try:
        cert_pem = (loaded.state_dir / CERT_STATE).read_text()
        ca_pem = (loaded.state_dir / CA_STATE).read_text()
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
    except (OSError, ValueError):
        return None
    now = now or clock.now_utc()
    if key_pem == PLACEHOLDER or public_key(cert) != public_key(key_pem):
        return None
    renew_from = cert.not_valid_after_utc - datetime.timedelta(seconds=RENEW_S)
    if now >= renew_from:
        return None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return None
    if access is not None and access.operator_ca is not None:
        operator = x509.load_pem_x509_certificate(access.operator_ca.encode())
        if operator != ca:
            return None
    # Kept from this reading of the clock until the renewal window opens (toolkit/clock.py).
    clock.holds_until(renew_from)
    return cert_pem, ca_pem


def credential_files(loaded: LoadedCluster) -> list[ManagedFile]:
    """The key always; the certificate and CA once kept (see the module's docstring). None
    without Kubernetes."""
    if metrics_access(loaded) is None:
        return []
    key = client_key(loaded)
    files = [
        ManagedFile(
            "monitoring", CLIENT_KEY, key + "\n", mode="0640", group="prometheus", secret=True
        )
    ]
    current = current_certificate(loaded, key)
    if current is not None:
        cert_pem, ca_pem = current
        files += [
            ManagedFile("monitoring", CLIENT_CERT, cert_pem),
            ManagedFile("monitoring", CLUSTER_CA, ca_pem),
        ]
    return files


def cluster_objects(loaded: LoadedCluster) -> dict[str, str]:
    """kubelet's `nodes/metrics` for Prometheus' user (the API servers', the scheduler's and the
    controller manager's /metrics come with GROUP)."""
    if metrics_access(loaded) is None:
        return {}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": KUBELET_METRICS_ROLE},
        "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": KUBELET_METRICS_ROLE},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": KUBELET_METRICS_ROLE,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    text = "---\n".join(json.dumps(obj, indent=2) + "\n" for obj in (role, binding))
    return {KUBELET_METRICS_OBJECTS: text}


def request_name(request: str) -> str:
    return "gpuinfra-prometheus-" + hashlib.sha256(request.encode()).hexdigest()[:12]


def signing_command(request: str, kubeconfig: str) -> str:
    """Create, approve and read back the certificate request on the first control-plane node;
    the certificate (base64) is the output's last line. The request is deleted either way."""
    name = request_name(request)
    manifest = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(request.encode()).decode(),
            "signerName": SIGNER,
            "expirationSeconds": CERT_S,
            "usages": ["digital signature", "client auth"],
        },
    }
    kubectl = f"kubectl --kubeconfig {shlex.quote(kubeconfig)}"
    read = f"{kubectl} get csr {name} -o jsonpath='{{.status.certificate}}'"
    return (
        f"{kubectl} delete csr {name} --ignore-not-found >/dev/null && "
        f"printf '%s' {shlex.quote(json.dumps(manifest))} | {kubectl} create -f - >/dev/null && "
        f"{kubectl} certificate approve {name} >/dev/null && "
        f"for attempt in $(seq {SIGN_WAIT_S}); do c=$({read}); "
        f'if [ -n "$c" ]; then {kubectl} delete csr {name} >/dev/null; echo "$c"; exit 0; fi; '
        f"sleep 1; done; {kubectl} delete csr {name} --ignore-not-found >/dev/null; "
        f"echo 'no certificate after {SIGN_WAIT_S} s' >&2; exit 1"
    )
