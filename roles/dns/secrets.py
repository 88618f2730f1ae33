"""State the dns role keeps on the controller, in the cluster's state directory: the TSIG key
that signs zone transfers, and each zone's serial with the digest of the records it numbers."""

from __future__ import annotations

import base64
import datetime
import json
import secrets
from collections.abc import Callable
from pathlib import Path

from inventory.model import StateAccess
from toolkit import clock
from toolkit.statefiles import kept_secret, private_dir, state_lock, write_secret_atomically

TSIG_KEY_NAME = "gpuinfra-transfer"
TSIG_ALGORITHM = "hmac-sha256"
# 32 bytes: the full strength of HMAC-SHA256 (RFC 8945 advises keys of the hash's length).
TSIG_BYTES = 32


def dns_state_dir(state_dir: Path) -> Path:
    return state_dir / "dns"


def tsig_secret(state_dir: Path, access: StateAccess = StateAccess.create) -> str:
    """The cluster's transfer key (base64): generated on first use by apply, kept 0600."""
    return kept_secret(
        state_dir,
        f"dns/{TSIG_KEY_NAME}.secret",
        lambda: base64.b64encode(secrets.token_bytes(TSIG_BYTES)).decode(),
        access,
    )


def next_serial(previous: int | None, today: datetime.date) -> int:
    """A serial in the YYYYMMDDnn convention that is always above the previous one, so
    secondaries (which only transfer a higher serial, RFC 1982) always pick a change up."""
    first_today = int(today.strftime("%Y%m%d")) * 100
    if previous is None or previous < first_today:
        return first_today
    return previous + 1


def zone_serial(
    state_dir: Path,
    zone: str,
    digest: str,
    today: Callable[[], datetime.date] = clock.today,
    access: StateAccess = StateAccess.create,
) -> int:
    """The zone's serial: unchanged while its records (digest) are, the next one otherwise.
    Rendering the same inventory twice thus gives the same file, and a plan after an apply
    shows no change; the date is read only for a new serial (toolkit/clock.py). Only apply
    (`StateAccess.create`) records a new serial; plan and render compute the one apply would
    record."""
    path = dns_state_dir(state_dir) / "serials.json"

    def serial_from(serials: dict) -> int:
        entry = serials.get(zone)
        if entry and entry["digest"] == digest:
            return int(entry["serial"])
        return next_serial(int(entry["serial"]) if entry else None, today())

    if access is not StateAccess.create:
        return serial_from(_read_serials(path))
    with state_lock(state_dir):
        serials = _read_serials(path)
        serial = serial_from(serials)
        if serials.get(zone) != {"digest": digest, "serial": serial}:
            serials[zone] = {"digest": digest, "serial": serial}
            private_dir(path.parent)
            text = json.dumps(serials, indent=2, sort_keys=True) + "\n"
            write_secret_atomically(path, text.encode())
    return serial


def _read_serials(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
