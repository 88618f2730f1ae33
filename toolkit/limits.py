"""Raise the open-files limit before pyinfra is imported: it caps parallelism by it."""

from __future__ import annotations

import resource

# Each connected host holds about three descriptors; 65536 covers 20,000 hosts in one process.
WANTED_NOFILE = 65536


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = WANTED_NOFILE if hard == resource.RLIM_INFINITY else min(WANTED_NOFILE, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft
