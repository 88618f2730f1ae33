"""Node exporter on every host: running, answering, reading gpu_health's textfile directory."""

from __future__ import annotations

from inventory.topology import NODE_EXPORTER_PORT
from roles.monitoring.files import textfile_dir

# No TARGET_GROUPS: the role's node exporter phase targets every host.


def test_node_exporter_is_running_and_enabled(host):
    service = host.service("prometheus-node-exporter")
    assert service.is_running
    assert service.is_enabled


def test_node_exporter_answers(host):
    out = host.check_output(f"curl -fsS http://127.0.0.1:{NODE_EXPORTER_PORT}/metrics")
    assert "node_load1 " in out


def test_textfile_collector_reads_the_gpu_health_directory(host, ctx):
    directory = textfile_dir(ctx)
    assert host.file(directory).is_directory
    out = host.check_output(f"curl -fsS http://127.0.0.1:{NODE_EXPORTER_PORT}/metrics")
    assert 'node_scrape_collector_success{collector="textfile"} 1' in out
    args = host.file("/etc/default/prometheus-node-exporter").content_string
    assert f"--collector.textfile.directory={directory} " in args
