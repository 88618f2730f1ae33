"""Helpers every test suite shares: run the installed CLI, read the files a host is given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inventory.model import LoadedCluster

# The console script installed beside this interpreter: what an operator runs.
GPUINFRA = str(Path(sys.executable).parent / "gpuinfra")
# A lab's first apply of every role on fresh hosts, a guard against a hang and no target: 478 s
# on a quiet machine, 1,155 s with the other integration process applying its lab beside it,
# and past 1,800 s (the guard then) on 2026-12-02, when this machine ran the unit tests in
# 332 s where it had taken 187 s that morning.
FIRST_APPLY_S = 3600


def gpuinfra(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run `gpuinfra ARGS` as a separate process (no stdin: a prompt fails instead of hanging)."""
    return subprocess.run(
        [GPUINFRA, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def files_of(
    loaded: LoadedCluster, host: str, role: str | None = None, *, contents: bool = True
) -> dict[str, Any]:
    """The files one host is given, by path (only those of `role` when named): their text, or
    the ManagedFile itself (its mode, owner and check too) with contents=False."""
    from engine.context import host_context, host_files

    return {
        managed.path: managed.content if contents else managed
        for managed in host_files(host_context(loaded, host))
        if role is None or managed.role == role
    }


def lab_module_order(modules: list[str], shared: set[str], kubernetes: set[str]) -> list[str]:
    """The order integration modules run in (`modules` as collected): those with labs of their
    own first, then those on the session lab, each kept in its collected order, and the modules
    of the Kubernetes lab together where the first of them was."""
    first: dict[str, int] = {}
    for index, module in enumerate(modules):
        first.setdefault("kubernetes" if module in kubernetes else module, index)

    def place(module: str) -> tuple[bool, int]:
        return module in shared, first["kubernetes" if module in kubernetes else module]

    return sorted(modules, key=place)  # stable: a group's modules keep their order


def self_signed(common_name: str) -> tuple[bytes, bytes]:
    """A throwaway self-signed certificate and its key, PEM, valid a day: made here, since lab
    hosts may have no openssl."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
