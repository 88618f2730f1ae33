"""Before apply changes anything: is the controller's etcd CA the one the members trust?

An apply from a checkout without the cluster's `.state/` would otherwise mint a new CA and push
certificates from it to a running etcd cluster, which then stops talking to itself. Each
member's live CA file is read over ssh (host keys checked) and its SHA-256 fingerprint compared
with the controller's: a new state is made only for members holding no CA yet, and a differing
CA stops the apply before anything changes.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from inventory.model import LoadedCluster
from roles.etcd.files import PKI
from roles.etcd.pki import NEXT_CA, PREVIOUS_CA, ca_fingerprint, local_ca_fingerprint, pki_dir
from toolkit.remote import run_remote
from toolkit.spec import PreApplyRefused

LIVE_CA = f"{PKI}/ca.crt"
NO_CA = "gpuinfra: no CA file"
READ_TIMEOUT_S = 30


class TrustRefused(PreApplyRefused):
    """The apply must not go on: the message names the host and why."""


@dataclass(frozen=True)
class LiveCA:
    host: str
    fingerprint: str | None = None  # None: the member holds no CA file yet
    error: str | None = None  # could not be read (unreachable, unreadable)
    # Every certificate of its CA bundle (the first is `fingerprint`): two during a rotation.
    bundle: tuple[str, ...] = ()


def read_live_ca(loaded: LoadedCluster, host: str) -> LiveCA:
    command = f"if [ -e {LIVE_CA} ]; then cat {LIVE_CA}; else echo '{NO_CA}'; fi"
    if loaded.cluster.ssh.user != "root":
        command = f"sudo -n sh -c {shlex.quote(command)}"
    done = run_remote(loaded, host, command, timeout=READ_TIMEOUT_S)
    if done.timed_out:
        return LiveCA(host, error=f"no answer in {READ_TIMEOUT_S} s")
    output = done.stdout
    if not done.ok:
        lines = done.stderr.strip().splitlines()
        return LiveCA(host, error=lines[-1] if lines else f"ssh exit {done.exit_code}")
    if output.strip() == NO_CA:
        return LiveCA(host)
    try:
        bundle = tuple(ca_fingerprint(pem) for pem in _pem_blocks(output))
        return LiveCA(host, fingerprint=ca_fingerprint(output), bundle=bundle)
    except ValueError:
        return LiveCA(host, error=f"{LIVE_CA} is not a PEM certificate")


def _pem_blocks(text: str) -> list[str]:
    end = "-----END CERTIFICATE-----"
    return [block + end for block in text.split(end) if "-----BEGIN CERTIFICATE-----" in block]


def _rotation_cas(loaded: LoadedCluster) -> set[str]:
    """The controller's CAs while a rotation is under way (the next or previous CA is there):
    a member the rotation has not reached yet trusts the old bundle, whose first certificate
    is no longer the signing CA; empty outside a rotation."""
    root = pki_dir(loaded)
    stems = [stem for stem in (NEXT_CA, PREVIOUS_CA) if (root / f"{stem}.crt").exists()]
    if not stems:
        return set()
    paths = [root / f"{stem}.crt" for stem in ("ca", *stems)]
    return {ca_fingerprint(path.read_bytes()) for path in paths if path.exists()}


def check_live_ca(loaded: LoadedCluster) -> list[LiveCA]:
    """Refuse (TrustRefused) when a member trusts another CA than the controller's state, or
    when the controller has no CA and a member holds one or cannot be asked."""
    members = loaded.cluster.in_group("etcd")
    if not members:
        return []
    with ThreadPoolExecutor(max_workers=len(members)) as pool:
        live = list(pool.map(lambda host: read_live_ca(loaded, host), members))
    local = local_ca_fingerprint(loaded)
    local_path = pki_dir(loaded) / "ca.crt"
    rotating = _rotation_cas(loaded)
    for entry in live:
        if rotating and set(entry.bundle or (entry.fingerprint,)) & rotating:
            continue  # mid-rotation (`etcd rotate-ca` resumes it): it trusts one of ours
        if local is None and entry.fingerprint is not None:
            raise TrustRefused(
                f"{entry.host}: holds an etcd CA (sha256 {entry.fingerprint[:16]}...) but the "
                f"controller has none ({local_path}): copy the cluster's .state/ here; "
                "refusing to make a new CA for a running cluster"
            )
        if local is None and entry.error is not None:
            raise TrustRefused(
                f"{entry.host}: cannot read its etcd CA ({entry.error}); the controller has no "
                f"CA ({local_path}) and makes one only when no member holds one"
            )
        if local is not None and entry.fingerprint not in (None, local):
            raise TrustRefused(
                f"{entry.host}: its etcd CA (sha256 {entry.fingerprint[:16]}...) is not the "
                f"controller's ({local_path}, sha256 {local[:16]}...): refusing to apply"
            )
    return live
