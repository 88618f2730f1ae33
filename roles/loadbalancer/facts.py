"""Facts of the loadbalancer role."""

from __future__ import annotations

from pyinfra.api import FactBase

# What HAProxy's master reports to systemd (sd_notify STATUS) after a reload it could not
# complete; it keeps the previous workers, so the old configuration goes on serving.
RELOAD_FAILED = "Reload failed!"


class HAProxyServing(FactBase):
    """Whether HAProxy serves its current configuration: it answers on the stats port and its
    last reload did not fail. systemd calls a master with a failed reload active."""

    def command(self, port: int) -> str:
        return (
            "systemctl show --property=StatusText haproxy 2>/dev/null || true; "
            f"curl -fsS -o /dev/null --max-time 3 http://127.0.0.1:{port}/stats 2>/dev/null "
            "&& echo serving || echo down"
        )

    def process(self, output: list[str]) -> bool:
        status = next((line for line in output if line.startswith("StatusText=")), "")
        answers = bool(output) and output[-1].strip() == "serving"
        return answers and status.removeprefix("StatusText=").strip() != RELOAD_FAILED


class ServersHeldDown(FactBase):
    """The servers an operator took out of rotation through HAProxy's runtime API (`disable
    server`, `set server ... state maint|drain`): `["kube-apiserver/cp-1 MAINT"]`, from the
    stats page's CSV (its 18th field is the status). A server down by its health check is not
    listed: that is the backend's health, not a setting."""

    def command(self, port: int) -> str:
        return (
            f"curl -fsS --max-time 3 'http://127.0.0.1:{port}/stats;csv' 2>/dev/null | "
            'awk -F, \'$18 ~ /^(MAINT|DRAIN)/ {print $1 "/" $2 " " $18}\' || true'
        )

    @staticmethod
    def default() -> list[str]:
        return []

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
