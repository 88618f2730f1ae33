"""Ed25519 keys for the Jobs' ssh identities: made once, kept 0600 under .state/."""

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
