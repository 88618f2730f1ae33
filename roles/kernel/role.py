"""The kernel role's record: every host; its reboots roll by each host's group policy."""

from __future__ import annotations

from roles.kernel.config import KernelConfig
from toolkit.spec import Phase, Role, lazy

ROLE = Role(
    name="kernel",
    config=KernelConfig,
    phases=(
        Phase(None, lazy("roles.kernel.files:managed_files"), lazy("roles.kernel.deploy:apply")),
    ),
    summary="sysctls, limits, modules, boot command line, governor, THP, pinned kernel",
)
