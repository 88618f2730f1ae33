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
# A Debian package, optionally :arch and =version, as apt-get install takes it.
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]*(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+)?$")
# A host name or an address (IPv4, IPv6), as chrony's `server` line takes it.
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$")
# A size as systemd reads it: 2G, 128M, 1.5T.
_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[KMGTPE]?$")
# A systemd calendar event on one line: hourly, Mon..Fri 02:00, *-*-* 00/6:00:00.
_CALENDAR = re.compile(r"^[A-Za-z0-9*:/.,~ -]+$")
# An http(s) URL with none of a shell's or a configuration file's own characters (quotes,
# `;`, `$`, backticks, backslashes, spaces).
_URL = re.compile(r"^https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+$")
# A container image reference: [registry[:port]/]path[:tag][@digest].
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
# A POSIX login name, at most 31 characters (the drift Job's account's rule before it).
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")

# A public key as an authorized_keys line holds it, options before it allowed: its type and its
# base64 blob (base.authorized_keys; roles/base/effective.py reads the same).
_PUBLIC_KEY = re.compile(r"(?:^|\s)(?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+\s+[A-Za-z0-9+/]+=*(?:\s+.*)?$")

# Kubernetes' own namespaces: a Job there runs beside the control plane's pods and is exempt
# from the fleet's admission policies; `default` is where anyone's stray pods land.
RESERVED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "default")


def _matching(pattern: re.Pattern[str], what: str):
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"not {what}")
        return value

    return check


def _job_namespace(value: str) -> str:
    if value in RESERVED_NAMESPACES:
        raise ValueError("reserved to Kubernetes: give the Job a namespace of its own")
    return value


def _public_key(value: str) -> str:
    if "\n" in value or "\r" in value or not _PUBLIC_KEY.search(value.strip()):
        raise ValueError("not one line holding a public key like ssh-ed25519 AAAA... comment")
    return value


def _path(value: str) -> str:
    if not _PATH.fullmatch(value) or ".." in value.split("/"):
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
PackageName = Annotated[
    str, AfterValidator(_matching(_PACKAGE, "a Debian package like jq or jq=1.7.1-3"))
]
ServerAddress = Annotated[str, AfterValidator(_matching(_HOST, "a host name or an address"))]
SystemdSize = Annotated[str, AfterValidator(_matching(_SIZE, "a size like 2G or 128M"))]
CalendarEvent = Annotated[
    str, AfterValidator(_matching(_CALENDAR, "a systemd calendar event like hourly"))
]
LoginName = Annotated[str, AfterValidator(_matching(_USER, "a login name like root"))]
Url = Annotated[str, AfterValidator(_matching(_URL, "an http(s) URL of plain characters"))]
ImageRef = Annotated[
    str, AfterValidator(_matching(_IMAGE, "an image like registry.k8s.io/pause:3.10.1"))
]
PublicKey = Annotated[str, AfterValidator(_public_key)]
