"""keepalived on clusters with two or more balancers: running, its config valid, api.vip serving."""

from __future__ import annotations

import pytest

from roles.loadbalancer.files import uses_keepalived


@pytest.fixture
def ha(ctx):
    if not uses_keepalived(ctx.cluster):
        pytest.skip("one load balancer: no virtual address to share, no keepalived")
    return ctx


def test_keepalived_is_running_and_enabled(host, ha):
    service = host.service("keepalived")
    assert service.is_running
    assert service.is_enabled


def test_live_config_passes_keepalived_check(host, ha):
    result = host.run("keepalived --config-test --use-file /etc/keepalived/keepalived.conf")
    assert result.rc == 0, result.stderr


def test_the_vip_answers_on_the_api_port(host, ha):
    vip, port = ha.cluster.api.vip, ha.cluster.api.port
    assert host.run(f"timeout 5 bash -c '</dev/tcp/{vip}/{port}'").rc == 0
