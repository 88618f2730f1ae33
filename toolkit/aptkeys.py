"""Third-party apt repository keys, pinned by fingerprint: the container runtime's (Docker)
and NVIDIA's repositories use `repository_key`; the kubernetes role its own operation built on
`fetch_key_commands` and `KeyFingerprints`."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation


class KeyFingerprints(FactBase):
    """Fingerprints of the OpenPGP keys in a key file; empty when it is missing."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (
            f"test -e {quoted} && gpg --show-keys --with-colons {quoted} 2>/dev/null "
            "| awk -F: '$1==\"fpr\"{print $10}' || true"
        )

    def process(self, output: list[str]) -> list[str]:
        return [line.strip().upper() for line in output if line.strip()]


def fetch_key_commands(url: str, fingerprint: str, dest: str) -> list[str]:
    """Download a repository key beside its place, accept it only with the pinned fingerprint,
    then move it in: a key that does not match never reaches apt."""
    staged = shlex.quote(dest + ".new")
    quoted_dest = shlex.quote(dest)
    directory = shlex.quote(dest.rsplit("/", 1)[0])
    check = (
        f"gpg --show-keys --with-colons {staged} | awk -F: '$1==\"fpr\"{{print $10}}' "
        f"| grep -qix {shlex.quote(fingerprint)}"
    )
    return [
        f"mkdir -p {directory}",
        f"curl -fsSL --retry 3 -o {staged} {shlex.quote(url)}",
        f"{check} || {{ rm -f {staged}; echo 'fingerprint is not {fingerprint}' >&2; exit 1; }}",
        f"chmod 0644 {staged} && mv -f {staged} {quoted_dest}",
    ]


@operation()
def repository_key(enabled: bool, url: str, fingerprint: str, dest: str):
    """A repository's apt key, pinned by fingerprint; nothing where the distribution's packages
    are used."""
    if not enabled:
        return
    if fingerprint.upper() in (host.get_fact(KeyFingerprints, path=dest) or []):
        return
    yield from fetch_key_commands(url, fingerprint, dest)
