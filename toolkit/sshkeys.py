"""The Jobs' ssh identities (drift_job, rollout_job): ed25519 keys, made once and kept 0600
under .state/, and the check of the sshd drop-in that admits them."""

from __future__ import annotations

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


# sshd reads its drop-ins by `Include /etc/ssh/sshd_config.d/*.conf`: a staged drop-in (named
# `.NAME.conf.gpuinfra-new`) is not read until it is moved into place, so it is checked
# together with the live configuration, as sshd will read them, before it is.
SSHD_DROPIN_CHECK = (
    '( f=$(mktemp) && printf "Include /etc/ssh/sshd_config\\nInclude %s\\n" {path} > "$f" '
    '&& sshd -t -f "$f"; rc=$?; rm -f "$f"; exit $rc )'
)
