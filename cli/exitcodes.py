"""Exit codes, documented and distinct so CI can tell what happened without parsing output."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # success; for drift: every host matches the inventory; for health: healthy
    ERROR = 1  # an operation failed on a host, or an unexpected error
    BAD_INPUT = 2  # invalid inventory or arguments; nothing was changed or contacted
    DRIFT = 3  # drift: at least one reachable host differs from the inventory
    UNREACHABLE = 4  # at least one host could not be reached (the others were still checked)
    DEGRADED = 5  # health: a check is outside its threshold but the node can keep working
    UNHEALTHY = 6  # health: a check failed; the node should be drained
    VERIFY_FAILED = 7  # verify: a verification check failed on a reachable host
    LOCKED = 8  # another apply holds the cluster's lock, or drift --job's Job (named); no change
