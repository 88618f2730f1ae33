"""The shared facts that read with shell builtins, run by this machine's sh against the
processes they replace."""

from __future__ import annotations

import subprocess

import pytest

from roles.facts import NodeName, lines_of


def sh(command: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", command], capture_output=True)


@pytest.mark.parametrize(
    "content",
    [
        b"UUID=1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n",
        b"  leading and trailing spaces  \n\ttab\\backslash \\n -e -n\n\n",
        b"no newline at the end",
        b"",
    ],
)
def test_lines_of_prints_what_cat_prints(tmp_path, content):
    path = tmp_path / "file"
    path.write_bytes(content)
    alone = sh(f"cat {path} 2>/dev/null || true")
    found = sh(lines_of(str(path)))
    assert found.returncode == alone.returncode == 0
    assert found.stdout.decode().splitlines() == alone.stdout.decode().splitlines()


def test_lines_of_a_missing_file_prints_nothing_and_succeeds(tmp_path):
    found = sh(lines_of(str(tmp_path / "missing")))
    assert (found.returncode, found.stdout, found.stderr) == (0, b"", b"")


def test_node_name_is_what_uname_prints():
    found = sh(NodeName().command())
    assert found.returncode == 0
    assert NodeName().process(found.stdout.decode().splitlines()) == (
        subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip()
    )
