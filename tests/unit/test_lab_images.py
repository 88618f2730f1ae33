"""The lab's image layers are cached by what they hold: a Debian base with another package list
is another layer, never the one built before the list changed (gpuinfra's image once kept a
base without openssh-client, so the drift Job's pods had no ssh).

Stand-in: debootstrap, which writes the package list into the root instead of installing it;
what is under test is the cache's key, not Debian."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import offline, rootfs


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    made: list[tuple[str, ...]] = []

    def debootstrap(root: Path, mirror, suite: str, packages: tuple[str, ...]) -> None:
        made.append(tuple(packages))
        (root / "packages").write_text(" ".join(packages))

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
