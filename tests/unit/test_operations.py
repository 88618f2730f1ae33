"""Managed files replace the live file atomically: staged beside it with its final owner and mode
before any byte is written, then moved over it (a killed controller leaves old or new)."""

from __future__ import annotations

import hashlib

from pyinfra.facts.files import File, Sha1File

from roles.operations import put_checked, staged_path
from tests.unit.fake_host import commands

DEST = "/etc/etcd/pki/member.key"
STAGED = "/etc/etcd/pki/.member.key.gpuinfra-new"


def test_staged_path_is_a_hidden_sibling():
    assert staged_path(DEST) == STAGED


def test_an_unchecked_file_is_staged_then_moved_never_written_in_place():
    ran, _ = commands(
        put_checked,
        {File: None, Sha1File: None},
        content="KEY",
        dest=DEST,
        mode="0600",
        user="etcd",
        group="etcd",
    )
    assert ran[0] == "mkdir -p /etc/etcd/pki"
    # Created empty, 0600 and owned by etcd before the upload fills it: never readable by others.
    assert ran[1] == (
        f"rm -f {STAGED} && (umask 077 && : > {STAGED}) && "
        f"chown etcd:etcd {STAGED} && chmod 0600 {STAGED}"
    )
    assert ran[2].startswith("FileUploadCommand(") and ran[2].endswith(f", {STAGED})")
    assert ran[3:] == [f"mv -f {STAGED} {DEST}"]


def test_a_checked_file_is_validated_before_the_move():
    ran, _ = commands(
        put_checked,
        {File: None, Sha1File: None},
        content="table",
        dest="/etc/nftables.conf",
        check="nft -c -f {path}",
    )
    staged = "/etc/.nftables.conf.gpuinfra-new"
    assert ran[3] == f"{{ nft -c -f {staged} ; }} || {{ rc=$?; rm -f {staged}; exit $rc; }}"
    assert ran[4] == f"mv -f {staged} /etc/nftables.conf"


def test_an_up_to_date_file_is_left_alone():
    digest = hashlib.sha1(b"KEY").hexdigest()
    current = {"mode": 600, "user": "etcd", "group": "etcd"}
    ran, noops = commands(
        put_checked,
        {File: current, Sha1File: digest},
        content="KEY",
        dest=DEST,
        mode="0600",
        user="etcd",
        group="etcd",
    )
    assert ran == [] and noops == [f"{DEST} is up to date"]


def test_a_wrong_mode_is_corrected_through_the_staged_file():
    digest = hashlib.sha1(b"KEY").hexdigest()
    current = {"mode": 644, "user": "etcd", "group": "etcd"}
    ran, _ = commands(
        put_checked,
        {File: current, Sha1File: digest},
        content="KEY",
        dest=DEST,
        mode="0600",
        user="etcd",
        group="etcd",
    )
    assert ran[-1] == f"mv -f {STAGED} {DEST}"
