"""State the dns role keeps on the controller, in the cluster's state directory: the TSIG key
that signs zone transfers, and each zone's serial with the digest of the records it numbers."""

from __future__ import annotations

import base64
import datetime
import json
import os
import secrets
from pathlib import Path

TSIG_KEY_NAME = "gpuinfra-transfer"
TSIG_ALGORITHM = "hmac-sha256"
# 32 bytes: the full strength of HMAC-SHA256 (RFC 8945 advises keys of the hash's length).
TSIG_BYTES = 32


def dns_state_dir(state_dir: Path) -> Path:
    folder = state_dir / "dns"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def tsig_secret(state_dir: Path) -> str:
    """The cluster's transfer key (base64), generated on first use and kept 0600."""
    path = dns_state_dir(state_dir) / f"{TSIG_KEY_NAME}.secret"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    secret = base64.b64encode(secrets.token_bytes(TSIG_BYTES)).decode()
    try:
        # O_EXCL: two hosts rendered at once must not end up with two different keys.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    return secret


def next_serial(previous: int | None, today: datetime.date) -> int:
    """A serial in the YYYYMMDDnn convention that is always above the previous one, so
    secondaries (which only transfer a higher serial, RFC 1982) always pick a change up."""
    first_today = int(today.strftime("%Y%m%d")) * 100
    if previous is None or previous < first_today:
        return first_today
    return previous + 1


def zone_serial(state_dir: Path, zone: str, digest: str, today: datetime.date) -> int:
    """The zone's serial: unchanged while its records (digest) are, the next one otherwise.
    Rendering the same inventory twice thus gives the same file, and a plan after an apply
    shows no change."""
    path = dns_state_dir(state_dir) / "serials.json"
    try:
        serials = json.loads(path.read_text())
    except FileNotFoundError:
        serials = {}
    entry = serials.get(zone)
    if entry and entry["digest"] == digest:
        return int(entry["serial"])
    serial = next_serial(int(entry["serial"]) if entry else None, today)
    serials[zone] = {"digest": digest, "serial": serial}
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(serials, indent=2, sort_keys=True) + "\n")
    partial.replace(path)
    return serial
