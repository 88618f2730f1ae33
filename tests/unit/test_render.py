"""Offline render: every host gets its files, every template renders under StrictUndefined."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from typer.testing import CliRunner

from cli.main import app
from engine import render as render_module
from engine.context import cluster_files, host_contexts, host_files, load
from engine.render import render_cluster
from tests.unit.conftest import SAMPLE
from tests.unit.test_kubernetes_lab_settings import OTHER_SETTINGS_TEMPLATES
from toolkit.templates import TEMPLATES, environment

runner = CliRunner()


def test_render_sample_writes_files_for_all_28_hosts(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", str(SAMPLE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    hosts = sorted(p.name for p in out.iterdir() if p.name != render_module.CLUSTER_DIR)
    assert len(hosts) == 28
    for host in hosts:
        assert (out / host / "etc/hostname").read_text() == f"{host}\n"
        assert (out / host / "etc/hosts").is_file()


# Templates a command renders when it runs, not `render`: each is rendered under StrictUndefined
# by the test named here.
RENDERED_BY_A_COMMAND = {
    "drift_job/fleet-job.yaml.j2": "tests/unit/test_fleet_job.py",
    "rollout_job/rollout-job.yaml.j2": "tests/unit/test_rollout_job.py",
}
# Templates only other settings than the sample's reach (release binaries, the routed CNI, the
# node-local API proxy) are rendered under StrictUndefined by the lab settings' test that lists
# them (OTHER_SETTINGS_TEMPLATES).


def test_every_template_is_rendered_from_the_sample(tmp_path):
    """Each template under templates/ must be used, so StrictUndefined has checked all of them."""
    environment.cache_clear()
    render_cluster(load(SAMPLE), tmp_path)
    used = {key[1] for key in environment().cache}
    present = {str(p.relative_to(TEMPLATES)) for p in TEMPLATES.rglob("*.j2")}
    assert present, "no templates found"
    assert present - used == set(RENDERED_BY_A_COMMAND) | OTHER_SETTINGS_TEMPLATES
    for test in RENDERED_BY_A_COMMAND.values():
        assert "render_template" in (SAMPLE.parents[1] / test).read_text()


def test_every_rendered_file_ends_with_a_newline():
    """POSIX text files end in a newline; a template that ends on a block tag loses it to
    trim_blocks (the alert rules did), so render_template puts it back."""
    loaded = load(SAMPLE)
    contents = {
        f"{ctx.name}:{f.path}": f.content for ctx in host_contexts(loaded) for f in host_files(ctx)
    }
    contents |= {f"_cluster/{rel}": text for rel, text in cluster_files(loaded).items()}
    assert "mon-1:/etc/prometheus/gpuinfra-alerts.yml" in contents
    assert [name for name, text in contents.items() if not text.endswith("\n")] == []


def test_a_missing_variable_is_an_error_not_an_empty_string(tmp_path):
    (tmp_path / "t.j2").write_text("value={{ not_given }}\n")
    env = environment().overlay(loader=jinja2.FileSystemLoader(tmp_path))
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("t.j2").render()


def _hosts_file(loaded, name: str) -> str:
    ctx = next(ctx for ctx in host_contexts(loaded) if ctx.name == name)
    return next(f for f in host_files(ctx) if f.path == "/etc/hosts").content


def test_with_dns_servers_the_hosts_file_holds_only_what_precedes_dns():
    loaded = load(SAMPLE)
    hosts_file = _hosts_file(loaded, "gpu-1")
    entries = [line.split() for line in hosts_file.splitlines() if line[:1].isdigit()]
    # Besides localhost: itself, the DNS servers and the API endpoint, and no other host.
    listed = {words[2] for words in entries if words[1] != "localhost"}
    assert listed == {"gpu-1", "dns-1", "dns-2", "api"}
    assert "10.40.0.10 api.sample.gpu.internal api\n" in hosts_file
    assert "127.0.0.1 localhost\n" in hosts_file


def test_without_dns_servers_the_hosts_file_lists_every_host(
    small_cluster, write_cluster, load_small
):
    del small_cluster["hosts"]["dns-1"]
    loaded = load_small()
    hosts_file = _hosts_file(loaded, "cpu-1")
    for name, host in loaded.cluster.hosts.items():
        assert f"{host.address} {name}.small.test {name}\n" in hosts_file
    # Positive control for the test above: the same cluster with its DNS server lists fewer.
    with_dns = _hosts_file(load(write_cluster(dict(small_cluster, hosts={
        **small_cluster["hosts"], "dns-1": {"address": "10.0.0.41", "groups": ["dns"]}
    }))), "cpu-1")  # fmt: skip
    assert "10.0.0.11 etcd-1.small.test etcd-1\n" not in with_dns


def test_the_hosts_file_does_not_grow_with_the_fleet():
    from benchmarks.fleet import fleet_data
    from inventory.building import build

    sizes = {}
    for hosts in (50, 500):
        loaded = build(fleet_data(hosts), source=Path("fleet.yml"), base_dir=Path("."))
        sizes[hosts] = _hosts_file(loaded, "gpu-00001").count("\n")
    assert sizes[50] == sizes[500]


def test_group_and_host_vars_reach_the_templates(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "all": {"base": {"ntp_servers": ["ntp.all"]}},
        "etcd": {"base": {"ntp_servers": ["ntp.etcd"]}},
    }
    small_cluster["hosts"]["etcd-2"]["vars"] = {"base": {"ntp_servers": ["ntp.host"]}}
    loaded = load_small()
    chrony = {
        ctx.name: next(f for f in host_files(ctx) if "chrony" in f.path).content
        for ctx in host_contexts(loaded)
    }
    assert "pool ntp.all iburst" in chrony["cpu-1"]
    assert "pool ntp.etcd iburst" in chrony["etcd-1"]
    assert "pool ntp.host iburst" in chrony["etcd-2"]


def test_debian_sources_enable_non_free(loaded):
    sources = next(
        f for f in host_files(host_contexts(loaded)[0]) if f.path.endswith("gpuinfra.sources")
    )
    assert "Suites: trixie trixie-updates" in sources.content
    assert "Components: main contrib non-free non-free-firmware" in sources.content


def test_render_is_deterministic(tmp_path):
    loaded = load(SAMPLE)
    render_cluster(loaded, tmp_path / "a")
    render_cluster(loaded, tmp_path / "b")
    first = {
        p.relative_to(tmp_path / "a"): p.read_bytes()
        for p in (tmp_path / "a").rglob("*")
        if p.is_file()
    }
    second = {
        p.relative_to(tmp_path / "b"): p.read_bytes()
        for p in (tmp_path / "b").rglob("*")
        if p.is_file()
    }
    assert first == second


def test_cli_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("inventory", "render", "lab", "health"):
        assert command in result.stdout


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("gpuinfra ")


def test_repo_paths():
    assert Path(TEMPLATES).is_dir()
