"""Operations of the loadbalancer role."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from roles.loadbalancer.facts import HAProxyServing
from toolkit.operations import wait_for


@operation()
def haproxy_serving(stats_port: int):
    """Restart HAProxy when it does not serve what its file says: a reload that failed (an fd
    limit it could not raise, say) keeps the old workers, and the old configuration (Debian's
    default on a first install, with no listener at all), while no file change would ever
    trigger another reload. A plan shows it as a pending change."""
    if host.get_fact(HAProxyServing, port=stats_port):
        host.noop("HAProxy is serving")
        return
    yield "systemctl restart haproxy"
    yield wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{stats_port}/stats")
