"""`etcd rotate-certs` and `etcd rotate-ca`: new certificates, or a new CA, rolled out by the
etcd role one member at a time, each step ending with a health check (rotate-ca's steps are
those of `day2.flows.ETCD_ROTATE_CA`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from day2.etcd.common import EtcdOperationError
from day2.etcd.health import status
from day2.steps import run_flow
from engine.reports import Mode, RunOptions
from engine.runner import run
from inventory.model import LoadedCluster
from roles.etcd.clusters import cluster_settings
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
    ensure_pki(
        loaded,
        cert_days=cfg.cert_days,
        ca_days=cfg.ca_days,
        rotate=True,
        events=cfg.events.enabled,
    )
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


@dataclass
class CaRotationRun:
    """One `etcd rotate-ca`: the stage the PKI files were in when it started (an earlier run
    may have stopped half way), and each step's roll-out."""

    loaded: LoadedCluster
    ca_days: int
    stage: str  # none, trusting, reissued (roles.etcd.pki.ca_rotation_stage)
    steps: list[CaRotationStep] = field(default_factory=list)


def rotate_ca(
    loaded: LoadedCluster,
    *,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CaRotationResult:
    """Replace the etcd CA with no moment where a member or client distrusts another, in the
    steps of `day2.flows.ETCD_ROTATE_CA`:

    1. trust-new: make the next CA; every member and client trusts old and new (rolled out by
       the role, members restarting one at a time, each waiting for a healthy cluster);
    2. reissue: the new CA signs; every member and client certificate is reissued from it
       (rolled out the same way; the old CA is still trusted for the ones not yet replaced);
    3. drop-old: the old CA is no longer trusted (rolled out the same way).

    Each step must end with every host applied and the cluster healthy before the next one
    starts. A run stopped half way resumes where it stopped (the stage is read from the PKI
    files: `ca-next.crt` or `ca-previous.crt` in `.state/etcd-pki/`): the steps it finished
    are reported as already done.
    """
    from day2.flows import ETCD_ROTATE_CA
    from roles.etcd import pki

    started = time.monotonic()
    stage = pki.ca_rotation_stage(loaded)
    old_ca = _ca_serial(loaded, pki.PREVIOUS_CA if stage == "reissued" else "ca")
    job = CaRotationRun(loaded, cluster_settings(loaded).ca_days, stage)
    run_flow(ETCD_ROTATE_CA, job, error=EtcdOperationError, skip=skip, only=only, progress=progress)
    return CaRotationResult(old_ca, _ca_serial(loaded, "ca"), job.steps, time.monotonic() - started)


def ca_trusting_done(job: CaRotationRun) -> bool:
    return job.stage in ("trusting", "reissued")


def ca_reissued_done(job: CaRotationRun) -> bool:
    return job.stage == "reissued"


def _rotation_step(job: CaRotationRun, step: str, change: Callable[[], object]) -> None:
    """Change the PKI files, roll them out, and stop unless every host applied and the cluster
    is healthy after it."""
    from roles.etcd import pki

    try:
        change()
    except pki.PkiError as exc:
        raise EtcdOperationError(str(exc)) from None
    job.steps.append(_roll_out(job.loaded, step))
    last = job.steps[-1]
    if last.apply_errors or last.health != "healthy":
        detail = "; ".join(f"{h}: {e}" for h, e in last.apply_errors.items())
        raise EtcdOperationError(f"cluster {last.health}" + (f"; {detail}" if detail else ""))


def ca_trust_new(job: CaRotationRun) -> None:
    from roles.etcd import pki

    _rotation_step(job, "trust-new", lambda: pki.begin_ca_rotation(job.loaded, ca_days=job.ca_days))


def ca_reissue(job: CaRotationRun) -> None:
    from roles.etcd import pki

    _rotation_step(job, "reissue", lambda: pki.promote_next_ca(job.loaded))


def ca_drop_old(job: CaRotationRun) -> None:
    from roles.etcd import pki

    _rotation_step(job, "drop-old", lambda: pki.drop_previous_ca(job.loaded))


def _left(job: CaRotationRun, step: str, state: str) -> str:
    rolled_out = bool(job.steps) and job.steps[-1].step == step
    return (
        f"CA rotation stopped after step {step}: "
        + (state if rolled_out else "the PKI files refused it, nothing was rolled out")
        + "; run `gpuinfra etcd rotate-ca` again to resume from this step"
    )


def ca_left_trusting(job: CaRotationRun) -> str:
    return _left(job, "trust-new", "the next CA is made, trusted where the roll-out reached")


def ca_left_reissued(job: CaRotationRun) -> str:
    return _left(job, "reissue", "the new CA signs, certificates reissued where it reached")


def ca_left_dropping(job: CaRotationRun) -> str:
    return _left(job, "drop-old", "the old CA is still trusted where the roll-out did not reach")


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
