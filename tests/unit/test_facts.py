"""The shared facts that read with shell builtins, run by this machine's sh against the
processes they replace."""

from __future__ import annotations

import subprocess

import pytest

from toolkit.facts import HeldPackages, NodeName, lines_of


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


def test_held_packages_are_named_as_apt_mark_names_them():
    """apt-mark prints a package's architecture only when it is neither the host's own nor
    "all"; a hold on a package that is not installed (no architecture) counts too."""
    output = [
        "amd64",
        "hold libcuda1 amd64",
        "install libc6 amd64",
        "hold libc6 i386",
        "hold nvidia-kernel-support all",
        "hold kubeadm ",
        "deinstall old amd64",
        "",
    ]
    held = HeldPackages().process(output)
    assert held == ["kubeadm", "libc6:i386", "libcuda1", "nvidia-kernel-support"]
    assert HeldPackages().process(["amd64"]) == []


def test_held_packages_on_this_machine_are_what_apt_mark_shows():
    """This machine's dpkg database, both ways (the lab's GPU host, which holds packages, is
    checked the same way in tests/integration/test_drift_fast.py)."""
    found = sh(HeldPackages().command())
    assert found.returncode == 0 and len(found.stdout.splitlines()) > 100  # every package
    apt = sh("apt-mark showhold").stdout.decode().split()
    assert HeldPackages().process(found.stdout.decode().splitlines()) == sorted(apt)
