"""Failures of the lab that an operator can act on, each with one line saying what to do."""

from __future__ import annotations


class LabError(Exception):
    """A lab operation failed; the message is one line meant for the operator."""


class LabMissingTool(LabError):
    """A program the lab needs is not installed; the message names the Debian package."""


class LabNotRoot(LabError):
    """The lab creates namespaces, mounts and links: only root may."""


class LabInvalid(LabError):
    """The request itself is wrong (a name, a size, a host that is not in the lab)."""
