"""The benchmark's flat pyinfra deploy and Ansible playbook hold the state `gpuinfra render`
wrote, host by host (no timing here: benchmarks never assert times)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import yaml

from benchmarks.engines import declared_state, write_engines
from benchmarks.report import markdown, projection
from engine.context import host_contexts, host_files, load
from engine.render import render_cluster
from tests.unit.conftest import SAMPLE


def test_both_engines_get_every_managed_file_and_package_list(tmp_path):
    loaded = load(SAMPLE)
    render_cluster(loaded, tmp_path / "render")
    state = declared_state(loaded, tmp_path / "render")
    files = write_engines(loaded, state, tmp_path / "engines")

    ast.parse(files.pyinfra_deploy.read_text())
    pyinfra_state = json.loads((tmp_path / "engines" / "pyinfra" / "state.json").read_text())
    ansible_hosts = yaml.safe_load(files.ansible_inventory.read_text())["all"]["hosts"]
    for ctx in host_contexts(loaded):
        expected = {f.path: f for f in host_files(ctx)}
        for entries in (pyinfra_state["files"][ctx.name], ansible_hosts[ctx.name]["managed_files"]):
            assert {e["path"] for e in entries} == set(expected)
            for entry in entries:
                managed = expected[entry["path"]]
                assert Path(entry["src"]).read_text() == managed.content
                assert (entry["mode"], entry["user"]) == (managed.mode, managed.user)
        assert ansible_hosts[ctx.name]["package_sets"] == pyinfra_state["packages"][ctx.name]
        assert pyinfra_state["packages"][ctx.name], "the base role's packages"

    cfg = files.ansible_cfg.read_text()
    assert "host_key_checking = True" in cfg
    assert f"forks = {len(loaded.cluster.hosts)}" in cfg
    assert "StrictHostKeyChecking=yes" in cfg

    # The floor reads the same state file, and reaches every host with the inventory's SSH.
    assert files.state == (tmp_path / "engines" / "pyinfra" / "state.json").resolve()
    floor_hosts = json.loads(files.floor_hosts.read_text())
    assert floor_hosts["addresses"] == {
        name: str(host.address) for name, host in loaded.cluster.hosts.items()
    }
    assert floor_hosts["ssh"]["user"] == loaded.cluster.ssh.user


def run(engine, seconds, cpu, mib, hosts):
    return {"engine": engine, "hosts": hosts, "seconds": seconds, "cpu_seconds": cpu,
            "peak_tree_mib": mib, "max_process_mib": mib, "returncode": 0, "changes": 0,
            "load_before": 1.0}  # fmt: skip


def test_projection_fits_a_line_through_the_sizes_and_shards_the_fleet():
    drift = {
        str(n): {"hosts": n, "operations_per_host": {"same_state": 8},
                 "runs": [run("gpuinfra", 2 + 0.05 * n, 1 + 0.01 * n, 80 + 0.5 * n, n),
                          run("pyinfra", 1 + 0.05 * n, 1, 70, n),
                          run("ansible", 20 * n, 5, 900, n)]}
        for n in (10, 100, 200)
    }  # fmt: skip
    p = projection(drift)
    assert (p["wall_fixed_seconds"], p["wall_per_host_seconds"]) == (2.0, 0.05)
    assert p["shards"] == 38 and p["hosts_per_shard"] == 198
    assert p["one_process_seconds"] == round(2 + 0.05 * 7500)
    text = markdown({"drift": drift})
    assert "| 100 hosts | gpuinfra |" in text and "Projection to 7500 hosts" in text


def test_the_command_line_figures_are_reported_against_the_target():
    def entry(command, cpu):
        return {"command": command, "runs": 3, "cpu_seconds": cpu, "median_cpu_seconds": cpu[1],
                "min_cpu_seconds": min(cpu), "max_cpu_seconds": max(cpu),
                "median_seconds": 0.4, "load_before": [1.0, 2.0, 3.0]}  # fmt: skip

    text = markdown(
        {
            "cli": {
                "help": entry("gpuinfra --help", [0.2, 0.21, 0.25]),
                "validate": entry("gpuinfra inventory validate inventory/sample", [0.3, 0.31, 0.4]),
            }
        }
    )
    assert "| `gpuinfra --help` | 3 | 0.210 (0.200 to 0.250) | 0.400 | 2.0 |" in text
    assert "| `gpuinfra --help` under 0.3 s of CPU | 0.21 s (median of 3) | met |" in text
    assert (
        "| `gpuinfra inventory validate inventory/sample` under 0.3 s of CPU | 0.31 s "
        "(median of 3) | not met |" in text
    )
