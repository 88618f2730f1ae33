"""Grammars of the inventory strings that reach root shells or admin-applied YAML: a version is a
version, a check name a name, a namespace a DNS label, a disk a plain absolute path. Checked at
load (exit 2, file:line: key), so nothing downstream has to trust them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){1,3}$")
# Debian's debian_revision: alphanumerics, `.`, `+` and `~` (no hyphen: it ends the upstream part).
_DEBIAN_REVISION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+~]*$")
# kubeadm's check names: SystemVerification, Port-6443, FileAvailable--etc-kubernetes-....conf.
_CHECK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9.-]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_PATH = re.compile(r"^/[A-Za-z0-9._:+/-]+$")

# Kubernetes' own namespaces: a Job there runs beside the control plane's pods and is exempt
# from the fleet's admission policies; `default` is where anyone's stray pods land.
RESERVED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "default")


def _matching(pattern: re.Pattern[str], what: str):
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"not {what}")
        return value

    return check


def _job_namespace(value: str) -> str:
    if value in RESERVED_NAMESPACES:
        raise ValueError("reserved to Kubernetes: give the Job a namespace of its own")
    return value


def _path(value: str) -> str:
    if not _PATH.match(value) or ".." in value.split("/"):
        raise ValueError("not an absolute path of plain names (no '..')")
    return value


VersionText = Annotated[str, AfterValidator(_matching(_VERSION, "a version like 3.5.16"))]
DebianRevision = Annotated[
    str, AfterValidator(_matching(_DEBIAN_REVISION, "a Debian revision like 1.1"))
]
CheckName = Annotated[
    str, AfterValidator(_matching(_CHECK_NAME, "a kubeadm check name like SystemVerification"))
]
Namespace = Annotated[str, AfterValidator(_matching(_DNS_LABEL, "a namespace (a DNS label)"))]
JobNamespace = Annotated[Namespace, AfterValidator(_job_namespace)]
PlainPath = Annotated[str, AfterValidator(_path)]
