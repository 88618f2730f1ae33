"""The floor engine's comparison: one host's answers against the declared state, offline."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from benchmarks.floor import compare, remote_command

CONTENT = b"127.0.0.1 localhost\n"
DIGEST = hashlib.sha256(CONTENT).hexdigest()
FILES = [{"path": "/etc/hosts", "src": "/render/h1/etc/hosts", "mode": "0644",
          "user": "root", "group": "root"}]  # fmt: skip
HASHES = {"/render/h1/etc/hosts": DIGEST}
PACKAGES = ["chrony", "etcd-server=3.5.16-4"]


def answers(*, mode="644", owner="root\troot", digest=DIGEST, chrony="ii ", etcd="3.5.16-4"):
    return (
        f"stat\t/etc/hosts\t{mode}\t{owner}\n"
        f"hash\t{digest}  /etc/hosts\n"
        f"pkg\tchrony\t{chrony}\t4.6-1\n"
        f"pkg\tetcd-server\tii \t{etcd}\n"
    )


def test_a_host_in_the_declared_state_has_no_differences() -> None:
    assert compare(FILES, PACKAGES, answers(), HASHES) == []


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        ({"mode": "600"}, "/etc/hosts: mode 600, declared 0644"),
        ({"owner": "root\tadm"}, "/etc/hosts: owner root:adm"),
        ({"digest": "0" * 64}, "/etc/hosts: content differs"),
        ({"chrony": "rc "}, "package chrony: not installed"),
        ({"etcd": "3.5.15-1"}, "package etcd-server: version 3.5.15-1, declared 3.5.16-4"),
    ],
)
def test_each_difference_is_reported(changed: dict, expected: str) -> None:
    assert compare(FILES, PACKAGES, answers(**changed), HASHES) == [expected]


def test_a_missing_file_and_package_are_differences() -> None:
    assert compare(FILES, PACKAGES, "", HASHES) == [
        "/etc/hosts: missing",
        "package chrony: not installed",
        "package etcd-server: not installed",
    ]


def test_the_remote_command_answers_in_the_format_compare_reads(tmp_path) -> None:
    """The command runs here, in a local shell, on a real file: what the hosts' sh would run."""
    target = tmp_path / "hosts"
    target.write_bytes(CONTENT)
    target.chmod(0o644)
    owner = subprocess.run(["stat", "-c", "%U\t%G", str(target)], capture_output=True, text=True)
    files = [dict(FILES[0], path=str(target), user=owner.stdout.split("\t")[0],
                  group=owner.stdout.strip().split("\t")[1])]  # fmt: skip
    output = subprocess.run(
        ["sh", "-c", remote_command(files, [])], capture_output=True, text=True, check=True
    ).stdout
    assert compare(files, [], output, HASHES) == []
    target.write_bytes(b"changed\n")
    output = subprocess.run(
        ["sh", "-c", remote_command(files, [])], capture_output=True, text=True, check=True
    ).stdout
    assert compare(files, [], output, HASHES) == [f"{target}: content differs"]
