"""The kernel role's record: every host; its reboots roll by each host's group policy."""

from __future__ import annotations

from roles.kernel import deploy, files
from roles.kernel.config import KernelConfig
from roles.spec import Phase, Role

ROLE = Role(
    name="kernel",
    config=KernelConfig,
    phases=(Phase(None, files.managed_files, deploy.apply),),
    summary="sysctls, limits, modules, boot command line, governor, THP, pinned kernel",
)
