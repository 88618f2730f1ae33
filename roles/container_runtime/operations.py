"""Operations of the container_runtime role: containerd from its release tarball."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation


class ContainerdVersion(FactBase):
    """The version the installed containerd reports ("2.2.9"); empty when there is none.
    `containerd --version` prints "containerd github.com/containerd/containerd/v2 v2.2.9 <rev>"."""

    default = str

    def command(self) -> str:
        return "containerd --version 2>/dev/null || true"

    def process(self, output: list[str]) -> str:
        words = " ".join(output).split()
        return words[2].removeprefix("v") if len(words) >= 3 else ""


CONTAINERD_PROGRAMS = ("bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr")


def containerd_tarball_url(base: str, version: str) -> str:
    """Where containerd's release puts its tarball (and a mirror of the same layout)."""
    return f"{base.rstrip('/')}/v{version}/containerd-{version}-linux-amd64.tar.gz"


@operation()
def containerd_binaries(url: str, version: str, sha256: str):
    """containerd, its runc shim and ctr from the release tarball, checked against its SHA-256
    before anything is unpacked; nothing when the installed containerd reports this version."""
    if host.get_fact(ContainerdVersion) == version:
        return
    staged = "/var/tmp/gpuinfra-containerd-download"
    yield f"curl -fsSL --retry 3 -o {staged} {shlex.quote(url)}"
    yield (
        f"echo '{sha256}  {staged}' | sha256sum -c --quiet - || "
        f"{{ rm -f {staged}; echo 'container_runtime: containerd SHA-256 mismatch' >&2; exit 1; }}"
    )
    yield f"tar -xzf {staged} -C /usr/local {' '.join(CONTAINERD_PROGRAMS)} && rm -f {staged}"
