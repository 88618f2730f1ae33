"""Defaults of the base role; inventory group_vars/host vars under `base:` override them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import (
    Keyword,
    PackageName,
    PlainPath,
    PublicKey,
    ServerAddress,
    SystemdSize,
    Url,
)


class BaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Debian/Ubuntu mirror URL; None keeps the distribution's default archive.
    apt_mirror: Url | None = None
    # Security archive; None: the mirror URL with "-security" appended (Debian's layout).
    apt_security_mirror: Url | None = None
    # HTTP proxy for apt only (fleets often reach mirrors through one); None for direct.
    apt_proxy: Url | None = None
    # Enable contrib/non-free (Debian) or restricted/multiverse (Ubuntu): NVIDIA userspace is there.
    apt_nonfree: bool = True
    # Tools an operator expects on every node when debugging at 3 a.m.
    packages: list[PackageName] = Field(
        default_factory=lambda: ["ca-certificates", "curl", "chrony", "jq", "less", "lsof", "rsync"]
    )
    # Extra /etc/hosts entries (name -> address), e.g. a package mirror reached without DNS.
    extra_hosts: dict[ServerAddress, ServerAddress] = Field(default_factory=dict)
    # NTP servers for chrony; etcd and TLS both break on skewed clocks.
    ntp_servers: list[ServerAddress] = Field(default_factory=lambda: ["pool.ntp.org"])
    # Cap the journal so a chatty node cannot fill its root disk.
    journald_max_use: SystemdSize = "2G"
    journald_max_file: SystemdSize = "128M"
    # Files the site adds on purpose where gpuinfra checks that nothing overrides its settings
    # (sshd drop-ins, apt's sources and pins, unit drop-ins, sysctl.d, system.conf.d,
    # containerd conf.d, chrony sources): absolute paths, never reported as drift. Anything
    # else there is, and stops an apply (toolkit/effective.py).
    site_files: list[PlainPath] = Field(default_factory=list)
    # Public keys (authorized_keys lines: `ssh-ed25519 AAAA… comment`) that may log in as the
    # ssh user and root beside the controller's own (ssh.key's public half): who can log in is
    # the first thing an operator checks, so any other key in their authorized_keys is drift.
    authorized_keys: list[PublicKey] = Field(default_factory=list)
    # Password logins invite brute force; keys only (root by key for provisioning).
    ssh_permit_root_login: Keyword = "prohibit-password"
