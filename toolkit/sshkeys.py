"""The Jobs' ssh identities (drift_job, rollout_job): ed25519 keys, made once and kept 0600
under .state/, and the check of the sshd drop-in that admits them."""

from __future__ import annotations

from typing import Any

from inventory.model import Cluster, LoadedCluster
from inventory.topology import collapse_sources, pod_block
from toolkit.spec import settings_of
from toolkit.statefiles import PLACEHOLDER


def new_ed25519() -> str:
    """A new private key in OpenSSH's format."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )


def public_key(private: str) -> str:
    """`ssh-ed25519 AAAA…` of a private key; the placeholder while only apply may make it."""
    if private == PLACEHOLDER:
        return PLACEHOLDER
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private.encode(), password=None)
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def certificate(
    authority: str,
    private: str,
    principal: str,
    key_id: str,
    valid: tuple[int, int],
    sources: tuple[str, ...],
) -> str:
    """An OpenSSH user certificate (`ssh-ed25519-cert-v01@openssh.com AAAA…`) of `private`'s
    public half, signed by the `authority` key: for `principal` only, valid from and to the
    epoch seconds of `valid`, from `sources` only (its critical source-address option, which
    sshd checks like the keys file's from=). No extension: no pty, no forwarding, no agent."""
    import secrets

    from cryptography.hazmat.primitives import serialization

    signer = serialization.load_ssh_private_key(authority.encode(), password=None)
    subject = serialization.load_ssh_private_key(private.encode(), password=None)
    builder = (
        serialization.SSHCertificateBuilder()
        .public_key(subject.public_key())  # type: ignore[arg-type]
        .serial(secrets.randbits(64))
        .type(serialization.SSHCertificateType.USER)
        .key_id(key_id.encode())
        .valid_principals([principal.encode()])
        .valid_after(valid[0])
        .valid_before(valid[1])
        .add_critical_option(b"source-address", ",".join(sources).encode())
    )
    return builder.sign(signer).public_bytes().decode()  # type: ignore[arg-type]


# sshd reads its drop-ins by `Include /etc/ssh/sshd_config.d/*.conf`: a staged drop-in (named
# `.NAME.conf.gpuinfra-new`) is not read until it is moved into place, so it is checked
# together with the live configuration, as sshd will read them, before it is.
SSHD_DROPIN_CHECK = (
    '( f=$(mktemp) && printf "Include /etc/ssh/sshd_config\\nInclude %s\\n" {path} > "$f" '
    '&& sshd -t -f "$f"; rc=$?; rm -f "$f"; exit $rc )'
)


def pod_sources(cluster: Cluster, node: str, kubernetes: Any) -> list[str]:
    """Where a Job node's own pods connect from when they reach the node itself (local
    delivery skips postrouting, so no masquerade): its pod block under "routes", the pod
    network under Calico (whose IPAM blocks move)."""
    if kubernetes.cni == "routes":
        return [str(pod_block(cluster, node, kubernetes.routes_block_prefix))]
    return [str(cluster.networks.pod)]


def key_sources(loaded: LoadedCluster, nodes: list[str], sources: list) -> tuple[str, ...]:
    """What a Job key's `from=` admits: the Job's nodes (their pods' traffic to other hosts
    leaves masqueraded to the node's address), their own pods, and `sources`."""
    cluster = loaded.cluster
    found = [str(source) for source in sources]
    for node in nodes:
        found.append(str(cluster.hosts[node].address))
        found += pod_sources(cluster, node, settings_of(loaded, node, "kubernetes"))
    return collapse_sources(found)
