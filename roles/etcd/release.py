"""Where etcd comes from: the upstream release tarball, pinned by SHA-256, or a mirror of it."""

from __future__ import annotations

from dataclasses import dataclass

from roles.etcd.config import EtcdConfig

UPSTREAM = "https://github.com/etcd-io/etcd/releases/download"
# SHA-256 of etcd-v<version>-linux-<arch>.tar.gz as published with each release (the
# release's SHA256SUMS; the same values Kubespray pins in its checksums.yml). A version not
# listed needs `etcd.sha256` in the inventory: nothing is ever downloaded unchecked.
CHECKSUMS: dict[tuple[str, str], str] = {
    ("3.5.12", "amd64"): "f2ff0cb43ce119f55a85012255609b61c64263baea83aa7c8e6846c0938adca5",
    ("3.5.12", "arm64"): "31f30c01918771ece28d6e553e0f33be9483ced989896ecf6bbe1edb07786141",
    ("3.5.11", "amd64"): "e256885e753dc99001335e099d3c2eb8cf21a865a087ee4d7e3665752ae5929a",
    ("3.5.11", "arm64"): "6edf0cddc8fa2d7674129abe2e44d5a37cc3a6e3b500c13c6cbc2ed2ecf08bf4",
    ("3.5.10", "amd64"): "26e90d024fa2310bc52bb40e7f2132e81640b55f8fc446c00ae07e30af2a44fd",
    ("3.5.10", "arm64"): "ff74a6018d9b2a1320bff30e5a11b4f2f5c2a3d147df8a8bad53c01b9f800ee1",
}
# Debian/Ubuntu architecture names to the ones etcd's releases use.
ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class ReleaseUnknown(ValueError):
    """No pinned checksum for this version and architecture, and none in the inventory."""


@dataclass(frozen=True)
class Release:
    url: str
    sha256: str
    folder: str  # the tarball's top folder, holding etcd, etcdctl and etcdutl


def release(cfg: EtcdConfig, version: str, machine: str) -> Release:
    """The tarball to download for a version on a machine (`uname -m`), and its checksum."""
    arch = ARCHITECTURES.get(machine)
    if arch is None:
        raise ReleaseUnknown(f"etcd has no release for architecture {machine}")
    folder = f"etcd-v{version}-linux-{arch}"
    base = (
        (cfg.mirror_url or "").rstrip("/") if cfg.source == "mirror" else f"{UPSTREAM}/v{version}"
    )
    sha256 = cfg.sha256 or CHECKSUMS.get((version, arch))
    if sha256 is None:
        raise ReleaseUnknown(
            f"no pinned SHA-256 for etcd {version} on {arch}: set etcd.sha256 in the inventory "
            f"(pinned: {', '.join(sorted({v for v, _ in CHECKSUMS}))}) or use source: distribution"
        )
    return Release(f"{base}/{folder}.tar.gz", sha256, folder)


def binary_dir(cfg: EtcdConfig) -> str:
    """Where etcd, etcdctl and etcdutl live: the package's /usr/bin or /usr/local/bin."""
    return "/usr/bin" if cfg.source == "distribution" else "/usr/local/bin"
