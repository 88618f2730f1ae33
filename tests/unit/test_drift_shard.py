"""`--shard I/N` splits the selected hosts deterministically; the Indexed Job runs one per pod."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from engine.render import render_cluster
from engine.selection import shard_hosts
from roles.drift_job.files import MANIFEST, cluster_files
from tests.unit.conftest import SAMPLE

runner = CliRunner()
HOSTS = [f"host-{i:03d}" for i in range(1, 24)]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 23, 40])
def test_shards_cover_every_host_once_and_differ_by_one_host_at_most(count):
    shards = [shard_hosts(HOSTS, index, count) for index in range(count)]
    assert sorted(h for shard in shards for h in shard) == sorted(HOSTS)
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1


def test_a_shard_depends_on_names_only_not_on_inventory_order():
    assert shard_hosts(HOSTS, 1, 4) == shard_hosts(list(reversed(HOSTS)), 1, 4)[::-1]
    assert shard_hosts(HOSTS, 1, 4) == ["host-002", "host-006", "host-010", "host-014",
                                        "host-018", "host-022"]  # fmt: skip


def test_a_shard_keeps_inventory_order():
    hosts = ["b", "a", "d", "c"]
    assert shard_hosts(hosts, 0, 2) == ["a", "c"]
    assert shard_hosts(list(reversed(hosts)), 0, 2) == ["c", "a"]


@pytest.mark.parametrize("index,count", [(2, 2), (-1, 2), (0, 0)])
def test_an_index_outside_the_shards_is_refused(index, count):
    with pytest.raises(ValueError):
        shard_hosts(HOSTS, index, count)


@pytest.mark.parametrize("value", ["1", "a/b", "2/2", "1/0", "-1/3"])
def test_bad_shard_option_is_bad_input(value):
    result = runner.invoke(app, ["drift", str(SAMPLE), "--shard", value])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "--shard" in result.stderr


def test_indexed_job_runs_one_shard_per_pod(load_small, small_cluster):
    hosts = {f"w-{i:03d}": {"address": f"10.0.{i // 250}.{i % 250 + 2}", "groups": ["cpu_worker"]}
             for i in range(450)}  # fmt: skip
    small_cluster["networks"]["node"] = "10.0.0.0/16"
    small_cluster["hosts"] = {**small_cluster["hosts"], **hosts}
    small_cluster["hosts"] = {
        name: {**h, "address": h["address"].replace("10.0.0.", "10.0.9.")}
        if not name.startswith("w-")
        else h
        for name, h in small_cluster["hosts"].items()
    }
    loaded = load_small()
    job = yaml.safe_load(cluster_files(loaded)[MANIFEST])
    assert job["kind"] == "Job"
    spec = job["spec"]
    # 460 hosts at 200 per shard: three pods, all at once.
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    container = spec["template"]["spec"]["containers"][0]
    assert container["args"][:4] == [
        "drift", "/etc/gpuinfra/inventory/cluster.yml", "--shard", "$(SHARD_INDEX)/3",
    ]  # fmt: skip
    index_env = next(e for e in container["env"] if e["name"] == "SHARD_INDEX")
    assert "job-completion-index" in index_env["valueFrom"]["fieldRef"]["fieldPath"]


def test_shard_count_is_a_setting_and_render_writes_the_job(load_small, small_cluster, tmp_path):
    small_cluster["group_vars"] = {"all": {"drift_job": {"shards": 4, "image": "reg/gi@sha256:ab"}}}
    loaded = load_small()
    render_cluster(loaded, tmp_path / "out")
    job = yaml.safe_load((tmp_path / "out" / "_cluster" / MANIFEST).read_text())
    assert job["spec"]["completions"] == 4
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/gi@sha256:ab"


def test_unknown_drift_job_key_is_refused(write_cluster, small_cluster):
    small_cluster["group_vars"] = {"all": {"drift_job": {"shard": 4}}}
    result = runner.invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "drift_job" in result.stderr
