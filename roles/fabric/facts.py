"""Facts the fabric role reads: whether the declared HCA ports exist on the host."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

SYSFS = "/sys/class/infiniband"


class FabricPorts(FactBase):
    """(device, port) -> True where the kernel knows the port (its sysfs folder exists):
    `{("mlx5_0", 1): True, ("mlx5_1", 1): False}`. Shell builtins only: one `test` per port."""

    @staticmethod
    def default() -> dict:
        return {}

    def command(self, ports: tuple[tuple[str, int], ...]) -> str:
        lines = []
        for device, port in ports:
            path = shlex.quote(f"{SYSFS}/{device}/ports/{port}")
            lines.append(
                f"if [ -d {path} ]; then echo {shlex.quote(device)} {port} present; "
                f"else echo {shlex.quote(device)} {port} missing; fi"
            )
        return "; ".join(lines) or "true"

    def process(self, output: list[str]) -> dict[tuple[str, int], bool]:
        found = {}
        for line in output:
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit():
                found[(parts[0], int(parts[1]))] = parts[2] == "present"
        return found
