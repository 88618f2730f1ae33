"""The Kubernetes version as a value: parsed once, spelled the way each consumer wants it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# kubeadm, dl.k8s.io and pkgs.k8s.io all name releases by MAJOR.MINOR.PATCH; the tag carries a
# leading "v", the Debian packages and the inventory do not.
_VERSION = re.compile(r"v?(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)")


@dataclass(frozen=True, order=True)
class KubernetesVersion:
    """One Kubernetes release, ordered by (major, minor, patch): 1.36.3 > 1.35.10."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> KubernetesVersion:
        """From "1.36.3" or "v1.36.3"; anything else is a ValueError that names the text."""
        match = _VERSION.fullmatch(text)
        if match is None:
            raise ValueError(
                f"{text!r} is not a Kubernetes version: expected MAJOR.MINOR.PATCH, e.g. 1.36.3"
            )
        return cls(int(match["major"]), int(match["minor"]), int(match["patch"]))

    @property
    def tag(self) -> str:
        """The release tag, as kubeadm and dl.k8s.io spell it: "v1.36.3"."""
        return f"v{self.plain}"

    @property
    def plain(self) -> str:
        """Without the "v", as the inventory and the Debian packages spell it: "1.36.3"."""
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def major_minor(self) -> str:
        """The minor release, which names pkgs.k8s.io's repository and the schemas: "1.36"."""
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return self.plain


def check_kubernetes_version(text: str) -> str:
    """A pydantic validator: the text unchanged when it parses (the file keeps its spelling)."""
    KubernetesVersion.parse(text)
    return text
