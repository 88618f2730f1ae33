"""The target operating systems: release code name and archive per OS (base writes the apt
sources from it; the container runtime and NVIDIA repositories pick their suite by it)."""

from __future__ import annotations

# Release code names and archive layout per target OS.
DISTRIBUTIONS = {
    "debian-12": ("debian", "bookworm", "http://deb.debian.org/debian"),
    "debian-13": ("debian", "trixie", "http://deb.debian.org/debian"),
    "ubuntu-22.04": ("ubuntu", "jammy", "http://archive.ubuntu.com/ubuntu"),
    "ubuntu-24.04": ("ubuntu", "noble", "http://archive.ubuntu.com/ubuntu"),
}
