"""State the shared_fs role keeps on the controller: the Ceph cluster's fsid, every daemon's and
client's cephx key and each OSD's uuid, generated once by apply and kept 0600 like the etcd CA."""

from __future__ import annotations

import base64
import os
import struct
import uuid
from pathlib import Path

from inventory.model import StateAccess
from toolkit import clock
from toolkit.statefiles import kept_secret

STATE_DIR = "shared_fs"
# CEPH_CRYPTO_AES, as `ceph-authtool --gen-print-key` writes a key (src/auth/Crypto.h).
CEPH_CRYPTO_AES = 1
AES_KEY_BYTES = 16


def new_cephx_key(now: float | None = None, random: bytes | None = None) -> str:
    """A cephx secret as Ceph encodes one: type, creation time (seconds, nanoseconds), length
    and 16 random bytes, in base64 (CryptoKey::encode)."""
    secret = random if random is not None else os.urandom(AES_KEY_BYTES)
    created = int(now if now is not None else clock.now_utc().timestamp())
    header = struct.pack("<HIIH", CEPH_CRYPTO_AES, created, 0, len(secret))
    return base64.b64encode(header + secret).decode()


def cephx_key(state_dir: Path, entity: str, access: StateAccess = StateAccess.create) -> str:
    """The key of one cephx entity (mon., client.admin, osd.0, client.training)."""
    return kept_secret(state_dir, f"{STATE_DIR}/{entity}.key", new_cephx_key, access)


def fsid(state_dir: Path, access: StateAccess = StateAccess.create) -> str:
    return kept_secret(state_dir, f"{STATE_DIR}/fsid", lambda: str(uuid.uuid4()), access)


def osd_uuid(state_dir: Path, osd_id: int, access: StateAccess = StateAccess.create) -> str:
    """The uuid an OSD is created with (its bluestore label carries it: how apply knows the
    disk is this OSD's and not a foreign one)."""
    return kept_secret(
        state_dir, f"{STATE_DIR}/osd.{osd_id}.uuid", lambda: str(uuid.uuid4()), access
    )
