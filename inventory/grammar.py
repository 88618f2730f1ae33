"""Grammars of the inventory strings that reach root shells or admin-applied YAML: a version is a
version, a check name a name, a namespace a DNS label, a disk a plain absolute path. Checked at
load (exit 2, file:line: key), so nothing downstream has to trust them."""

from __future__ import annotations

import re
from pathlib import Path
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
# A Debian package's name alone, as apt preferences' Package: line takes it.
_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*$")
# A Debian version as apt-get install pkg=version and dpkg take it: [epoch:]upstream[-revision],
# starting with a digit (so never an option) e.g. 6.8.0-60.63~22.04.1.
_DEBIAN_VERSION = re.compile(r"^([0-9]+:)?[0-9][A-Za-z0-9.+~-]*$")
# A kernel module's name, as modprobe and modules-load.d take it: nvidia-peermem, br_netfilter.
_KERNEL_MODULE = re.compile(r"^[A-Za-z0-9_-]+$")
# A kernel parameter, bare or name=value: iommu=pt, pci=realloc=off, console=ttyS0,115200n8.
# It lands inside GRUB_CMDLINE_LINUX_DEFAULT="...", a shell variable update-grub sources as root.
_KERNEL_ARGUMENT = re.compile(r"^[A-Za-z0-9_.,:=+-]+$")
# A sysctl's name in its dotted form: net.core.somaxconn, net.ipv4.conf.all.rp_filter.
_SYSCTL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# A sysctl's value on one line: words of plain characters, one space apart (net.ipv4.tcp_rmem
# takes "4096 87380 16777216"; kernel.core_pattern a path with %p).
_SYSCTL_VALUE = re.compile(r"^[A-Za-z0-9._:/%,+-]+( [A-Za-z0-9._:/%,+-]+)*$")
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
# A SHA-256 as sha256sum prints it, and an OpenPGP key's v4 fingerprint as gpg prints it.
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FINGERPRINT = re.compile(r"^[0-9A-Fa-f]{40}$")
# A release's tag: Calico's v3.29.1.
_TAG = re.compile(r"^v[0-9]+(\.[0-9]+){1,3}$")
# A duration as Go, haproxy and etcd read it: 15m, 1h30m, 500ms; a bare number where the
# program takes one (haproxy's milliseconds, etcd's revisions).
_DURATION = re.compile(
    r"^[0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h|d)?([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h|d))*$"
)
# A Kubernetes quantity (500m, 1Gi), and a kubelet eviction threshold: one, or a share (10%).
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_THRESHOLD = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|%)?$")
# Kubernetes' qualified name, [prefix/]name: a label's key, a resource's or an eviction
# signal's name (nvidia.com/gpu, ephemeral-storage, memory.available); a label's value.
_QUALIFIED = re.compile(
    r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
# A DNS name of lowercase labels (RFC 1123): cluster.internal, a ConfigMap's or Secret's name.
_DNS_NAME = re.compile(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
# A network interface, at most IFNAMSIZ - 1 characters: eth0, bond0.100.
_INTERFACE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
# A unit's or a collector's name: kubelet, nvidia-fabricmanager, getty@tty1.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]*$")
# An environment variable's name: NCCL_IB_HCA.
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# resolv.conf's options: rotate, timeout:2, ndots:5.
_RESOLVER_OPTION = re.compile(r"^[a-z0-9-]+(:[0-9]+)?$")
# A keyword of a configuration file's own: prohibit-password, no.
_KEYWORD = re.compile(r"^[a-z][a-z-]*$")
# A Ceph health check's code: MGR_MODULE_DEPENDENCY.
_HEALTH_CODE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# One word of a configuration file's line, where no grammar of its own applies (a mount
# option, an nccl.conf value, a password): none of a shell's or a configuration file's quoting
# or comment characters, no space, no newline.
_WORD = re.compile(r"^[A-Za-z0-9_.,:=^/@%+-]+$")
# Such words one space apart: a cron schedule, a comment, a command line.
_WORDS = re.compile(r"^[A-Za-z0-9_.,:=^/@%+*-]+( [A-Za-z0-9_.,:=^/@%+*-]+)*$")
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


def _word(value: str) -> str:
    if not _WORD.fullmatch(value) or ".." in value.split("/"):
        raise ValueError("not one word of plain characters (no quotes, spaces or '..')")
    return value


def _config_path(value: Path) -> Path:
    if any(c == '"' or not c.isprintable() for c in str(value)):
        raise ValueError("not a path ssh_config can hold (no newline, control character or '\"')")
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
DebianPackage = Annotated[
    str, AfterValidator(_matching(_PACKAGE_NAME, "a Debian package's name like ibverbs-utils"))
]
DebianVersion = Annotated[
    str, AfterValidator(_matching(_DEBIAN_VERSION, "a Debian version like 6.8.0-60.63~22.04.1"))
]
KernelModule = Annotated[
    str, AfterValidator(_matching(_KERNEL_MODULE, "a kernel module like br_netfilter"))
]
KernelArgument = Annotated[
    str, AfterValidator(_matching(_KERNEL_ARGUMENT, "a kernel parameter like iommu=pt"))
]
SysctlName = Annotated[
    str, AfterValidator(_matching(_SYSCTL_NAME, "a sysctl like net.core.somaxconn"))
]
SysctlValue = Annotated[
    str, AfterValidator(_matching(_SYSCTL_VALUE, "a sysctl value on one line like 4096 87380"))
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
# A controller's file as ssh_config names it, in double quotes where it has a space.
ConfigPath = Annotated[Path, AfterValidator(_config_path)]
Sha256 = Annotated[str, AfterValidator(_matching(_SHA256, "a SHA-256 (64 hex digits)"))]
KeyFingerprint = Annotated[
    str, AfterValidator(_matching(_FINGERPRINT, "a key's fingerprint (40 hex digits)"))
]
ReleaseTag = Annotated[str, AfterValidator(_matching(_TAG, "a release tag like v3.29.1"))]
Duration = Annotated[str, AfterValidator(_matching(_DURATION, "a duration like 15m or 1h30m"))]
Quantity = Annotated[str, AfterValidator(_matching(_QUANTITY, "a quantity like 500m or 1Gi"))]
Threshold = Annotated[
    str, AfterValidator(_matching(_THRESHOLD, "a quantity like 500Mi or a share like 10%"))
]
QualifiedName = Annotated[
    str, AfterValidator(_matching(_QUALIFIED, "a name like nvidia.com/gpu or memory.available"))
]
LabelValue = Annotated[
    str, AfterValidator(_matching(_LABEL_VALUE, "a label's value like H100-SXM5-80GB"))
]
DnsName = Annotated[str, AfterValidator(_matching(_DNS_NAME, "a DNS name like cluster.internal"))]
Interface = Annotated[str, AfterValidator(_matching(_INTERFACE, "an interface like eth0"))]
UnitName = Annotated[str, AfterValidator(_matching(_NAME, "a name like kubelet"))]
VariableName = Annotated[
    str, AfterValidator(_matching(_VARIABLE, "a variable's name like NCCL_IB_HCA"))
]
ResolverOption = Annotated[
    str, AfterValidator(_matching(_RESOLVER_OPTION, "a resolver option like timeout:2"))
]
HealthCode = Annotated[
    str, AfterValidator(_matching(_HEALTH_CODE, "a health check like MGR_MODULE_DEPENDENCY"))
]
Keyword = Annotated[str, AfterValidator(_matching(_KEYWORD, "a keyword like prohibit-password"))]
Uuid = Annotated[str, AfterValidator(_matching(_UUID, "a UUID in lowercase hex"))]
Word = Annotated[str, AfterValidator(_word)]
Words = Annotated[
    str, AfterValidator(_matching(_WORDS, "words of plain characters one space apart"))
]
