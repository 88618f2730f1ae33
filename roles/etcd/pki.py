"""The etcd PKI, made on the controller with `cryptography`: a CA, per-member server and peer
certificates, and client certificates for the API servers and operators.

Everything lives in the cluster's state directory (`.state/etcd-pki/`, ignored by git): the
folder is 0700 and every private key 0600 from its creation, written atomically under the state
lock. Leaf certificates are (re)issued when missing, when their names no longer match the
inventory, when they were not signed by the current CA, when fewer than `renew_days` are left,
or when asked to rotate, and only by a command that may create state (apply, etcd day-2): plan
and drift never write one, render shows a placeholder.

The CA is replaced only by `gpuinfra etcd rotate-ca`, in three steps that each end with a
rolling restart (day2.rotate_ca): `begin_ca_rotation` makes the next CA (`ca-next`), trusted
beside the current one; `promote_next_ca` makes it the signing CA and keeps the old one trusted
(`ca-previous`), so every leaf is reissued; `drop_previous_ca` stops trusting the old one. What
members and clients trust is `trusted_cas()`: every CA of those files that exists.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from inventory.model import LoadedCluster, StateAccess
from roles.etcd.clusters import EVENTS, MAIN, EtcdCluster
from toolkit import clock
from toolkit.statefiles import (
    PLACEHOLDER,
    StateMissing,
    private_dir,
    state_lock,
    write_atomically,
    write_secret_atomically,
)

PKI_DIR = "etcd-pki"
# Client identities besides the members: the API servers (kubeadm's name for it) and the
# operator certificate etcdctl uses in day-2 commands.
CLIENTS = ("kube-apiserver-etcd-client", "operator")
# Renew ahead of expiry: a certificate with less than this left is reported as expiring (and
# renewed on apply unless the inventory sets another etcd.cert_renew_days).
EXPIRING_DAYS = 30
# The CA files of a rotation in progress (see the module docstring).
NEXT_CA = "ca-next"
PREVIOUS_CA = "ca-previous"


class PkiError(RuntimeError):
    """The PKI on the controller is not in a state the asked step can start from."""


@dataclass(frozen=True)
class CertSpec:
    """What one certificate must say: its file stem, subject and names, and what it is for."""

    stem: str  # path below the PKI folder without extension, e.g. "etcd-1/server"
    common_name: str
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = True  # serverAuth (members); every certificate also has clientAuth
    organization: str | None = None


@dataclass(frozen=True)
class KeyPair:
    cert_pem: str
    key_pem: str


@dataclass(frozen=True)
class CertExpiry:
    name: str
    path: str
    not_after: str  # ISO 8601, UTC
    days_left: int
    serial: str

    @property
    def status(self) -> str:
        if self.days_left < 0:
            return "expired"
        return "expiring" if self.days_left < EXPIRING_DAYS else "ok"


def pki_dir(loaded: LoadedCluster) -> Path:
    return loaded.state_dir / PKI_DIR


def member_specs(
    loaded: LoadedCluster, host: str, etcd: EtcdCluster = MAIN
) -> tuple[CertSpec, CertSpec]:
    """Server and peer certificates of one member of the main or the Events cluster: every
    name and address it is reached by (a port is no part of a name: the two clusters' members
    on one host have the same names but the member's own)."""
    cluster = loaded.cluster
    member = etcd.member_name(loaded, host)
    address = str(cluster.hosts[host].address)
    names = tuple(dict.fromkeys([host, cluster.fqdn(host), member, "localhost"]))
    server = CertSpec(etcd.pki_stem(host, "server"), member, names, (address, "127.0.0.1"))
    peer = CertSpec(etcd.pki_stem(host, "peer"), member, names[:-1], (address,))
    return server, peer


def client_spec(name: str) -> CertSpec:
    # system:masters is what kubeadm gives the API server's etcd client; etcd ignores it.
    organization = "system:masters" if name == "kube-apiserver-etcd-client" else None
    return CertSpec(f"clients/{name}", name, server=False, organization=organization)


def all_specs(loaded: LoadedCluster, *, events: bool = False) -> list[CertSpec]:
    """Every certificate the CA signs: the members' (the Events cluster's too when `events`)
    and the clients'. The clients' serve both clusters (the API server has one etcd client)."""
    specs: list[CertSpec] = []
    for etcd in (MAIN, EVENTS) if events else (MAIN,):
        for host in loaded.cluster.in_group("etcd"):
            specs.extend(member_specs(loaded, host, etcd))
    specs.extend(client_spec(name) for name in CLIENTS)
    return specs


def ensure_pki(
    loaded: LoadedCluster,
    *,
    cert_days: int = 365,
    ca_days: int = 3650,
    rotate: bool = False,
    renew_days: int = EXPIRING_DAYS,
    now: dt.datetime | None = None,
    events: bool = False,
) -> dict[str, KeyPair]:
    """Every pair by stem, the signing CA as "ca" (the Events cluster's members' too when
    `events`). With `StateAccess.create`, make whatever is missing, stale or within
    `renew_days` of expiry (all leaves when `rotate`) under the state lock; otherwise write
    nothing: a missing CA is `StateMissing` (existing) or placeholders (placeholder), and a leaf
    apply would (re)issue is a placeholder, which plan and drift show as a change."""
    root = pki_dir(loaded)
    ca_cert_path = root / "ca.crt"
    renewal = _Renewal(now or clock.now_utc(), dt.timedelta(days=renew_days))
    if loaded.state_access is not StateAccess.create:
        if rotate:
            raise ValueError("rotating certificates needs StateAccess.create")
        if not ca_cert_path.exists():
            if loaded.state_access is StateAccess.existing:
                raise StateMissing(ca_cert_path)
            return {"ca": _placeholder("ca")} | {
                s.stem: _placeholder(s.stem) for s in all_specs(loaded, events=events)
            }
        return _read_pki(all_specs(loaded, events=events), root, renewal)
    with state_lock(loaded.state_dir):
        specs = all_specs(loaded, events=events)
        return _make_pki(loaded, specs, root, cert_days, ca_days, rotate, renewal)


def _make_pki(
    loaded: LoadedCluster,
    specs: list[CertSpec],
    root: Path,
    cert_days: int,
    ca_days: int,
    rotate: bool,
    renewal: _Renewal,
) -> dict[str, KeyPair]:
    private_dir(root)
    ca_key_path, ca_cert_path = root / "ca.key", root / "ca.crt"
    if not (ca_key_path.exists() and ca_cert_path.exists()):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key, f"{loaded.cluster.name} etcd CA", ca_days)
        _write_pair(root, "ca", ca_cert, ca_key)
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    pairs = {"ca": KeyPair(ca_cert_path.read_text(), ca_key_path.read_text())}
    for spec in specs:
        cert_path = root / f"{spec.stem}.crt"
        if rotate or not _matches(cert_path, spec, ca_cert, renewal):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _leaf_certificate(spec, key, ca_cert, ca_key, cert_days)
            _write_pair(root, spec.stem, cert, key)
        pairs[spec.stem] = KeyPair(cert_path.read_text(), (root / f"{spec.stem}.key").read_text())
    return pairs


def _read_pki(specs: list[CertSpec], root: Path, renewal: _Renewal) -> dict[str, KeyPair]:
    """What the state holds, a placeholder for each leaf apply would (re)issue."""
    ca_cert_path, ca_key_path = root / "ca.crt", root / "ca.key"
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_key = ca_key_path.read_text() if ca_key_path.exists() else _placeholder("ca").key_pem
    pairs = {"ca": KeyPair(ca_cert_path.read_text(), ca_key)}
    for spec in specs:
        cert_path = root / f"{spec.stem}.crt"
        if _matches(cert_path, spec, ca_cert, renewal):
            key_pem = cert_path.with_suffix(".key").read_text()
            pairs[spec.stem] = KeyPair(cert_path.read_text(), key_pem)
        else:
            pairs[spec.stem] = _placeholder(spec.stem)
    return pairs


def _placeholder(stem: str) -> KeyPair:
    return KeyPair(
        f"{PLACEHOLDER}: the certificate {stem}.crt, issued by apply\n",
        f"{PLACEHOLDER}: the private key {stem}.key, made by apply\n",
    )


def ca_fingerprint(pem: str | bytes) -> str:
    """SHA-256 fingerprint of a PEM certificate (of its DER form, as `openssl x509
    -fingerprint -sha256` prints it, lower-case hex without colons)."""
    data = pem.encode() if isinstance(pem, str) else pem
    der = x509.load_pem_x509_certificate(data).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def local_ca_fingerprint(loaded: LoadedCluster) -> str | None:
    """The fingerprint of the CA in the controller's state; None when there is none yet."""
    path = pki_dir(loaded) / "ca.crt"
    return ca_fingerprint(path.read_bytes()) if path.exists() else None


def expiry_report(loaded: LoadedCluster, now: dt.datetime | None = None) -> list[CertExpiry]:
    """Every certificate in the PKI folder with its expiry, soonest first."""
    now = now or dt.datetime.now(dt.UTC)
    root = pki_dir(loaded)
    report = []
    for path in sorted(root.rglob("*.crt")):
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        not_after = cert.not_valid_after_utc
        report.append(
            CertExpiry(
                name=str(path.relative_to(root).with_suffix("")),
                path=str(path),
                not_after=not_after.isoformat(),
                days_left=(not_after - now).days,
                serial=format(cert.serial_number, "x"),
            )
        )
    return sorted(report, key=lambda e: (e.days_left, e.name))


def trusted_cas(loaded: LoadedCluster) -> str:
    """The CA bundle members and clients trust: the signing CA, and during a rotation the next
    or the previous one too."""
    root = pki_dir(loaded)
    stems = ("ca", NEXT_CA, PREVIOUS_CA)
    return "".join((root / f"{s}.crt").read_text() for s in stems if (root / f"{s}.crt").exists())


def ca_rotation_stage(loaded: LoadedCluster) -> str:
    """Where a CA rotation stands: "none", "trusting" (the next CA made and trusted, not yet
    signing) or "reissued" (the new CA signs, the previous one is still trusted)."""
    root = pki_dir(loaded)
    if (root / f"{NEXT_CA}.crt").exists():
        return "trusting"
    if (root / f"{PREVIOUS_CA}.crt").exists():
        return "reissued"
    return "none"


def begin_ca_rotation(loaded: LoadedCluster, *, ca_days: int = 3650) -> x509.Certificate:
    """Step 1: make the next CA (its own name, so chains never confuse the two)."""
    root = pki_dir(loaded)
    stage = ca_rotation_stage(loaded)
    if not (root / "ca.crt").exists():
        raise PkiError(f"{root}: no etcd CA to rotate")
    if stage == "reissued":
        raise PkiError(f"{root}: {PREVIOUS_CA}.crt exists: the last rotation is not finished")
    if stage == "none":
        key = ec.generate_private_key(ec.SECP256R1())
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        cert = _ca_certificate(key, f"{loaded.cluster.name} etcd CA {stamp}", ca_days)
        _write_pair(root, NEXT_CA, cert, key)
    return x509.load_pem_x509_certificate((root / f"{NEXT_CA}.crt").read_bytes())


def promote_next_ca(loaded: LoadedCluster) -> None:
    """Step 2: the next CA signs from now on; the old one stays trusted as the previous CA.
    Each file move is atomic and the whole step can be run again after a crash."""
    root = pki_dir(loaded)
    next_key, next_cert = root / f"{NEXT_CA}.key", root / f"{NEXT_CA}.crt"
    if not next_cert.exists():
        raise PkiError(f"{root}: no {NEXT_CA}.crt: begin the rotation first")
    if not (root / f"{PREVIOUS_CA}.crt").exists():
        write_atomically(root / f"{PREVIOUS_CA}.crt", (root / "ca.crt").read_bytes(), 0o644)
    if next_key.exists():
        next_key.replace(root / "ca.key")
    next_cert.replace(root / "ca.crt")


def drop_previous_ca(loaded: LoadedCluster) -> None:
    """Step 3: the old CA is no longer trusted anywhere once this is rolled out."""
    root = pki_dir(loaded)
    if ca_rotation_stage(loaded) == "trusting":
        raise PkiError(f"{root}: {NEXT_CA}.crt exists: promote it before dropping the old CA")
    (root / f"{PREVIOUS_CA}.crt").unlink(missing_ok=True)


@dataclass(frozen=True)
class _Renewal:
    """A certificate is renewed once it expires within `window` of `now`."""

    now: dt.datetime
    window: dt.timedelta


def _matches(cert_path: Path, spec: CertSpec, ca_cert: x509.Certificate, renewal: _Renewal) -> bool:
    """An existing certificate is kept while it is signed by this CA, is valid past
    the renewal window and names what the inventory says (an address change re-issues it)."""
    key_path = cert_path.with_suffix(".key")
    if not (cert_path.exists() and key_path.exists()):
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    if cert.not_valid_after_utc <= renewal.now + renewal.window:
        return False
    # Kept from this reading of the clock until its renewal window opens (toolkit/clock.py).
    clock.holds_until(cert.not_valid_after_utc - renewal.window)
    try:
        # The signature, not only the issuer's name: a new CA may carry the old one's name.
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(sans.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    return sorted(dns) == sorted(spec.dns_names) and sorted(ips) == sorted(spec.ip_addresses)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    # Back-dated an hour so a member whose clock is slightly behind accepts a fresh certificate.
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    return start, start + dt.timedelta(days=days)


def _ca_certificate(key: ec.EllipticCurvePrivateKey, name: str, days: int) -> x509.Certificate:
    start, end = _validity(days)
    subject = _name(name)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures for every certificate; signing certificates and CRLs for the CA only."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf_certificate(
    spec: CertSpec,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key,
    days: int,
) -> x509.Certificate:
    start, end = _validity(days)
    # etcd's members are servers and clients of each other (peers), and its gRPC gateway
    # dials the member with the server certificate: members need both usages.
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if spec.server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(spec.common_name, spec.organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
            critical=False,
        )
    )
    if spec.dns_names or spec.ip_addresses:
        alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in spec.dns_names]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in spec.ip_addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_pair(root: Path, stem: str, cert: x509.Certificate, key) -> None:
    target = root / stem
    private_dir(target.parent)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # The key is 0600 before a byte is written: never readable by others, even briefly.
    write_secret_atomically(target.with_suffix(".key"), key_pem)
    write_atomically(target.with_suffix(".crt"), cert.public_bytes(serialization.Encoding.PEM))
