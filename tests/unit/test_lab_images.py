"""The lab's image layers are cached by what they hold: a Debian base with another package list
is another layer, never the one built before the list changed (gpuinfra's image once kept a
base without openssh-client, so the drift Job's pods had no ssh).

Stand-in: debootstrap, which writes the package list into the root instead of installing it;
what is under test is the cache's key, not Debian."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab import offline, rootfs


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    made: list[tuple[str, ...]] = []

    def debootstrap(root: Path, mirror, suite: str, packages: tuple[str, ...]) -> None:
        made.append(tuple(packages))
        (root / "packages").write_text(" ".join(packages))
        (root / "etc").mkdir()
        (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        (root / "etc/group").write_text("root:x:0:\n")

    monkeypatch.setattr(offline, "BASE_DIR", tmp_path / "images")
    monkeypatch.setattr(rootfs, "debootstrap", debootstrap)
    return made


def test_a_base_is_built_once_per_package_list(builds) -> None:
    first = offline._debian_base("gpuinfra-base", ("python3",), None)
    again = offline._debian_base("gpuinfra-base", ("python3",), None)
    assert again == first and builds == [("python3",)]
    wider = offline._debian_base("gpuinfra-base", ("python3", "openssh-client"), None)
    assert wider != first and builds == [("python3",), ("python3", "openssh-client")]
    assert first.is_file() and wider.is_file()


def test_an_account_is_in_the_base_and_in_its_key(builds, tmp_path: Path) -> None:
    """The drift Job's pods run as uid 65532: ssh needs it in /etc/passwd."""
    plain = offline._debian_base("gpuinfra-base", ("openssh-client",), None)
    base = offline._debian_base("gpuinfra-base", ("openssh-client",), None, (("nonroot", 65532),))
    assert base != plain
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(base)], check=True)
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert passwd[0].startswith("root:") and passwd[-1].startswith("nonroot:x:65532:65532:")
    assert (root / "etc/group").read_text().splitlines()[-1] == "nonroot:x:65532:"
    assert offline.GPUINFRA_ACCOUNTS == (("nonroot", 65532),)
