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


# The versions a cluster runs when its inventory pins none, and the sample's: what the lab
# builds and runs together (go/kubernetes-1.35, go/etcd-3.6, go/containerd-2), so what a user
# applies is what ran. etcd 3.6 because kubeadm 1.35 refuses an external etcd older than
# 3.5.24; containerd 2 because Kubernetes 1.36 refuses 1.x (both rows below).
DEFAULT_KUBERNETES = "1.35.4"
DEFAULT_ETCD = "3.6.16"
DEFAULT_CONTAINERD = "2.2.9"


# What each Kubernetes minor gpuinfra sets up needs of the components the inventory pins, in
# one place: `inventory validate` refuses a pin below a minimum (roles/kubernetes/checks.py).
# The minors are those whose sources were read for gang scheduling (roles/fleet_policy/gang.py)
# and that the lab builds and runs (go/kubernetes-1.35, go/kubernetes-1.36).
@dataclass(frozen=True)
class KubernetesNeeds:
    """The oldest etcd and containerd one Kubernetes minor runs with, and where that is said."""

    min_etcd: str
    min_containerd: str
    source: str


# etcd: kubeadm's preflight refuses an external etcd older than MinExternalEtcdVersion
# (cmd/kubeadm/app/constants/constants.go: "3.5.24-0" in both v1.35.4 and v1.36.1; their
# SupportedEtcdVersion, the version kubeadm is tested with, is 3.6.6-0 and 3.6.8-0).
# containerd: Kubernetes 1.35 is the last minor that supports containerd 1.x (its release
# announcement); 1.36 needs containerd 2 (lab/offline.py's pin: the lab's 1.36 nodes run 2.2.9,
# Debian 13's 1.7 is refused).
KUBERNETES_NEEDS: dict[str, KubernetesNeeds] = {
    "1.35": KubernetesNeeds(
        min_etcd="3.5.24",
        min_containerd="1.7.0",
        source="kubeadm v1.35.4 MinExternalEtcdVersion; containerd 1.7 last supported",
    ),
    "1.36": KubernetesNeeds(
        min_etcd="3.5.24",
        min_containerd="2.0.0",
        source="kubeadm v1.36.1 MinExternalEtcdVersion; kubelet 1.36 refuses containerd 1.x",
    ),
}


def supported_range() -> str:
    """The Kubernetes minors gpuinfra supports, as one phrase: "1.35 to 1.36"."""
    minors = sorted(KUBERNETES_NEEDS, key=lambda m: tuple(int(p) for p in m.split(".")))
    return minors[0] if len(minors) == 1 else f"{minors[0]} to {minors[-1]}"


def release_key(text: str) -> tuple[int, ...] | None:
    """ "3.6.16" (or "v3.6.16", "1.7.24~ds1") as (3, 6, 16); None when it has no such prefix."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())


def kubernetes_needs(kubernetes: str) -> KubernetesNeeds | None:
    """The row of the version's minor; None for a minor gpuinfra does not support."""
    return KUBERNETES_NEEDS.get(KubernetesVersion.parse(kubernetes).major_minor)


def unsupported_kubernetes(kubernetes: str) -> str | None:
    """One line naming the supported range first, or None where the minor is supported."""
    minor = KubernetesVersion.parse(kubernetes).major_minor
    if minor in KUBERNETES_NEEDS:
        return None
    return (
        f"gpuinfra supports Kubernetes {supported_range()}, not {minor}: set "
        f"versions.kubernetes to a release of {supported_range()} (e.g. "
        f"{DEFAULT_KUBERNETES})"
    )
