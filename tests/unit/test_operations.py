"""Managed files replace the live file atomically (staged beside it with its final owner and mode
before any byte is written, then moved over it: a killed controller leaves old or new), and a
write stays marked pending until its phase's restarts have run."""

from __future__ import annotations

import hashlib
from typing import Any

from pyinfra.context import ctx_host
from pyinfra.facts.files import File, Sha1File

from roles.operations import clear_pending, pending_marker, put_checked, staged_path

DEST = "/etc/etcd/pki/member.key"
STAGED = "/etc/etcd/pki/.member.key.gpuinfra-new"
MARKER = "/var/lib/gpuinfra/pending/etc%2Fetcd%2Fpki%2Fmember.key"
MOVE = f"mkdir -p /var/lib/gpuinfra/pending && touch {MARKER} && mv -f {STAGED} {DEST}"
KEY_FILE = {"mode": 600, "user": "etcd", "group": "etcd"}


class KeyedHost:
    """Facts keyed by class and path, so a lookup of the wrong path finds nothing."""

    def __init__(self, facts: dict[tuple[type, str], Any]):
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, fact: type, path: str) -> Any:
        return self.facts.get((fact, path))

    def noop(self, message: str) -> None:
        self.noops.append(message)


def run(operation, facts: dict[tuple[type, str], Any], **arguments: Any):
    host = KeyedHost(facts)
    with ctx_host.use(host):
        return [str(c) for c in operation._inner(**arguments)], host.noops


def put_key(facts: dict[tuple[type, str], Any]):
    return run(put_checked, facts, content="KEY", dest=DEST, mode="0600", user="etcd", group="etcd")


def test_staged_path_and_marker_are_named_after_the_file():
    assert staged_path(DEST) == STAGED
    assert pending_marker(DEST) == MARKER


def test_an_unchecked_file_is_staged_then_moved_never_written_in_place():
    ran, _ = put_key({})
    assert ran[0] == "mkdir -p /etc/etcd/pki"
    # Created empty, 0600 and owned by etcd before the upload fills it: never readable by others.
    assert ran[1] == (
        f"rm -f {STAGED} && (umask 077 && : > {STAGED}) && "
        f"chown etcd:etcd {STAGED} && chmod 0600 {STAGED}"
    )
    assert ran[2].startswith("FileUploadCommand(") and ran[2].endswith(f", {STAGED})")
    assert ran[3:] == [MOVE]


def test_a_checked_file_is_validated_before_the_move():
    ran, _ = run(
        put_checked, {}, content="table", dest="/etc/nftables.conf", check="nft -c -f {path}"
    )
    staged = "/etc/.nftables.conf.gpuinfra-new"
    assert ran[3] == f"{{ nft -c -f {staged} ; }} || {{ rc=$?; rm -f {staged}; exit $rc; }}"
    assert ran[4].endswith(f"mv -f {staged} /etc/nftables.conf")


def test_an_up_to_date_file_is_left_alone():
    digest = hashlib.sha1(b"KEY").hexdigest()
    ran, noops = put_key({(File, DEST): KEY_FILE, (Sha1File, DEST): digest})
    assert ran == [] and noops == [f"{DEST} is up to date"]


def test_an_up_to_date_file_still_marked_pending_counts_as_changed():
    """Written by a run that stopped before the reload hanging off it: changed again, so the
    reload runs now."""
    digest = hashlib.sha1(b"KEY").hexdigest()
    facts = {(File, DEST): KEY_FILE, (Sha1File, DEST): digest, (File, MARKER): {"mode": 644}}
    ran, _ = put_key(facts)
    assert ran == [f"test -e {MARKER}"]


def test_a_wrong_mode_is_corrected_through_the_staged_file():
    digest = hashlib.sha1(b"KEY").hexdigest()
    ran, _ = put_key({(File, DEST): dict(KEY_FILE, mode=644), (Sha1File, DEST): digest})
    assert ran[-1] == MOVE


def test_clear_pending_removes_only_the_marks_present():
    other = "/etc/hosts"
    ran, _ = run(clear_pending, {(File, MARKER): {"mode": 644}}, paths=[DEST, other])
    assert ran == [f"rm -f {MARKER}"]
    ran, noops = run(clear_pending, {}, paths=[DEST, other])
    assert ran == [] and noops == ["no restart pending"]
