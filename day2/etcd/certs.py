"""`etcd rotate-certs` and `etcd rotate-ca`: new certificates, or a new CA, rolled out by the
etcd role one member at a time, each step ending with a health check."""

from __future__ import annotations

import time
from dataclasses import dataclass

from day2.etcd.common import EtcdOperationError
from day2.etcd.health import status
from engine.reports import Mode, RunOptions
from engine.runner import run
from inventory.model import LoadedCluster
from roles.etcd.files import cluster_settings
from roles.etcd.pki import CertExpiry, ensure_pki, expiry_report


@dataclass
class RotateResult:
    before: list[CertExpiry]
    after: list[CertExpiry]
    apply_status: dict[str, str]
    apply_errors: dict[str, str]
    health: str
    seconds: float


def rotate_certs(loaded: LoadedCluster) -> RotateResult:
    """New leaf certificates and keys for every member and client (same CA), rolled out with
    the etcd role: members restart one at a time, each waiting until the cluster is healthy."""
    started = time.monotonic()
    before = expiry_report(loaded)
    cfg = cluster_settings(loaded)
    ensure_pki(loaded, cert_days=cfg.cert_days, ca_days=cfg.ca_days, rotate=True)
    report = run(loaded, RunOptions(mode=Mode.apply, roles=("etcd",)))
    return RotateResult(
        before=before,
        after=expiry_report(loaded),
        apply_status={name: str(h.status) for name, h in report.hosts.items()},
        apply_errors={name: h.error for name, h in report.hosts.items() if h.error},
        health=status(loaded).health,
        seconds=time.monotonic() - started,
    )


@dataclass
class CaRotationStep:
    step: str  # trust-new, reissue, drop-old
    apply_status: dict[str, str]
    apply_errors: dict[str, str]
    health: str
    seconds: float


@dataclass
class CaRotationResult:
    old_ca_serial: str | None
    new_ca_serial: str | None
    steps: list[CaRotationStep]
    seconds: float


CA_STEPS = ("trust-new", "reissue", "drop-old")


def rotate_ca(loaded: LoadedCluster) -> CaRotationResult:
    """Replace the etcd CA with no moment where a member or client distrusts another:

    1. trust-new: make the next CA; every member and client trusts old and new (rolled out by
       the role, members restarting one at a time, each waiting for a healthy cluster);
    2. reissue: the new CA signs; every member and client certificate is reissued from it
       (rolled out the same way; the old CA is still trusted for the ones not yet replaced);
    3. drop-old: the old CA is no longer trusted (rolled out the same way).

    Each step must end with every host applied and the cluster healthy before the next one
    starts. A run stopped half way resumes where it stopped (the stage is read from the PKI
    files: `ca-next.crt` or `ca-previous.crt` in `.state/etcd-pki/`).
    """
    from roles.etcd import pki
    from roles.etcd.files import cluster_settings

    started = time.monotonic()
    cfg = cluster_settings(loaded)
    old_ca = _ca_serial(loaded, "ca")
    stage = pki.ca_rotation_stage(loaded)
    todo = {"none": CA_STEPS, "trusting": CA_STEPS[1:], "reissued": CA_STEPS[2:]}[stage]
    if stage == "reissued":
        old_ca = _ca_serial(loaded, pki.PREVIOUS_CA)
    steps: list[CaRotationStep] = []
    try:
        for step in todo:
            if step == "trust-new":
                pki.begin_ca_rotation(loaded, ca_days=cfg.ca_days)
            elif step == "reissue":
                pki.promote_next_ca(loaded)
            else:
                pki.drop_previous_ca(loaded)
            steps.append(_roll_out(loaded, step))
            last = steps[-1]
            if last.apply_errors or last.health != "healthy":
                detail = "; ".join(f"{h}: {e}" for h, e in last.apply_errors.items())
                raise EtcdOperationError(
                    f"CA rotation stopped after step {step}: cluster {last.health}"
                    + (f"; {detail}" if detail else "")
                    + "; run `gpuinfra etcd rotate-ca` again to resume from this step"
                )
    except pki.PkiError as exc:
        raise EtcdOperationError(str(exc)) from None
    return CaRotationResult(old_ca, _ca_serial(loaded, "ca"), steps, time.monotonic() - started)


def _ca_serial(loaded: LoadedCluster, stem: str) -> str | None:
    from cryptography import x509

    from roles.etcd.pki import pki_dir

    path = pki_dir(loaded) / f"{stem}.crt"
    if not path.exists():
        return None
    return format(x509.load_pem_x509_certificate(path.read_bytes()).serial_number, "x")


def _roll_out(loaded: LoadedCluster, step: str) -> CaRotationStep:
    """One apply of the etcd role (members one at a time, then the clients) and a health check."""
    from engine.reports import Mode, RunOptions
    from engine.runner import run

    started = time.monotonic()
    report = run(loaded, RunOptions(mode=Mode.apply, roles=("etcd",)))
    return CaRotationStep(
        step=step,
        apply_status={name: str(h.status) for name, h in report.hosts.items()},
        apply_errors={name: h.error for name, h in report.hosts.items() if h.error},
        health=status(loaded).health,
        seconds=time.monotonic() - started,
    )
