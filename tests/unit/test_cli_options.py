"""Every option that parses a value: a bad value exits 2 with one line on stderr and no
traceback (issue 13, defect 5).

The inventory's hosts are loopback addresses where nothing listens for SSH, and the lab cases
are refused while parsing, before anything boots: no case reaches a host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from tests.unit.loopback import loopback_cluster

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

CLUSTER = "{cluster}"  # replaced by a loopback cluster folder in tmp_path

BAD_VALUES = [
    # option values the engine commands parse
    (["apply", CLUSTER, "--yes", "--batch", "1.5"], "--batch"),
    (["apply", CLUSTER, "--yes", "--batch", "0"], "--batch"),
    (["apply", CLUSTER, "--yes", "--batch", "-2"], "--batch"),
    (["apply", CLUSTER, "--yes", "--batch", "abc"], "--batch"),
    (["apply", CLUSTER, "--yes", "--batch", "0%"], "--batch"),
    (["apply", CLUSTER, "--yes", "--batch", "150%"], "--batch"),
    (["apply", CLUSTER, "--yes", "--rate", "fast"], "--rate"),
    (["apply", CLUSTER, "--yes", "--rate", "0/30s"], "--rate"),
    (["apply", CLUSTER, "--yes", "--fail-percent", "abc"], "--fail-percent"),
    (["apply", CLUSTER, "--yes", "--fail-percent", "-1"], "--fail-percent"),
    (["apply", CLUSTER, "--yes", "--fail-percent", "101"], "--fail-percent"),
    (["apply", CLUSTER, "--yes", "--parallel", "0"], "--parallel"),
    (["apply", CLUSTER, "--yes", "--parallel", "many"], "--parallel"),
    (["apply", CLUSTER, "--yes", "--connect-timeout", "0"], "--connect-timeout"),
    (["apply", CLUSTER, "--yes", "--connect-timeout", "soon"], "--connect-timeout"),
    (["apply", CLUSTER, "--yes", "--limit", "nosuchhost"], "--limit"),
    (["apply", CLUSTER, "--yes", "--limit", "etcd-1,typo"], "typo"),
    (["apply", CLUSTER, "--yes", "--roles", "bsae"], "--roles"),
    (["apply", CLUSTER, "--yes", "--format", "xml"], "--format"),
    (["plan", CLUSTER, "--shard", "1"], "--shard"),
    (["plan", CLUSTER, "--shard", "2/2"], "--shard"),
    (["plan", CLUSTER, "--shard", "a/b"], "--shard"),
    (["plan", CLUSTER, "--parallel", "-1"], "--parallel"),
    (["plan", CLUSTER, "--connect-timeout", "-5"], "--connect-timeout"),
    (["plan", CLUSTER, "--limit", "nosuchgroup"], "--limit"),
    (["plan", CLUSTER, "--roles", "etcd,nope"], "--roles"),
    (["drift", CLUSTER, "--shard", "3/2"], "--shard"),
    (["drift", CLUSTER, "--limit", "nosuchhost"], "--limit"),
    (["drift", CLUSTER, "--parallel", "0"], "--parallel"),
    (["verify", CLUSTER, "--parallel", "0"], "--parallel"),
    (["verify", CLUSTER, "--limit", "nosuchhost"], "--limit"),
    (["verify", CLUSTER, "--roles", "nope"], "--roles"),
    (["render", CLUSTER], "--out"),
    (["inventory", "show", CLUSTER, "--format", "yaml"], "--format"),
    (["inventory", "import", "tests/unit/data/kubespray", "--node-network", "bogus"], "bogus"),
    (["inventory", "import", "tests/unit/data/kubespray", "--name", "Bad_Name!"], "name"),
    (["etcd", "check-disk", CLUSTER, "--max-ms", "0"], "--max-ms"),
    (["etcd", "check-disk", CLUSTER, "--max-ms", "fast"], "--max-ms"),
    # health options
    (["health", "run", "--expect-count", "0"], "--expect-count"),
    (["health", "run", "--expect-count", "eight"], "--expect-count"),
    (["health", "run", "--dcgm-level", "9"], "--dcgm-level"),
    (["health", "run", "--replay", "/nonexistent/recording.json"], "/nonexistent"),
    (["health", "run", "--expect-file", "/nonexistent/expect.json"], "/nonexistent"),
    (["health", "run", "--format", "csv"], "--format"),
    (["health", "fleet", CLUSTER, "--sample", "0"], "--sample"),
    (["health", "fleet", CLUSTER, "--all", "--budget", "abc"], "--budget"),
    (["health", "fleet", CLUSTER, "--all", "--budget", "150%"], "--budget"),
    (["health", "fleet", CLUSTER, "--all", "--seed", "x"], "--seed"),
    # lab options (refused while parsing: nothing boots)
    (["lab", "up", "--name", "statecli", "--hosts", "0"], "--hosts"),
    (["lab", "up", "--name", "statecli", "--hosts", "two"], "--hosts"),
    (["lab", "up", "--name", "statecli", "--topology", "huge"], "--topology"),
    (["lab", "up", "--name", "statecli", "--parallel", "0"], "--parallel"),
    (["lab", "up", "--name", "statecli", "--disk", "etcd-1"], "etcd-1"),
    (["lab", "up", "--name", "statecli", "--disk", "etcd-1=1X"], "1X"),
    (["lab", "attach-disk", "etcd-1", "12Q", "--name", "statecli"], "12Q"),
    (["lab", "status", "--name", "statecli", "--format", "xml"], "--format"),
]


@pytest.mark.parametrize(
    ("argv", "named"), BAD_VALUES, ids=[" ".join(argv[:1] + argv[2:]) for argv, _ in BAD_VALUES]
)
def test_bad_value_is_one_line_and_exit_2(argv, named, tmp_path):
    cluster = loopback_cluster(tmp_path / "loop")
    args = [str(cluster) if a == CLUSTER else a for a in argv]
    if args[:2] == ["inventory", "import"]:
        args += ["--out", str(tmp_path / "imported.yml")]
    result = runner.invoke(app, args)
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and named in lines[0]
    assert "Traceback" not in result.output
    assert not (cluster / ".state").exists()  # nothing was created or changed


def test_a_good_value_passes_the_same_checks(tmp_path):
    """Positive control: valid values of the options above get past parsing (to the state
    check, which needs `.state/`)."""
    cluster = loopback_cluster(tmp_path / "loop")
    args = ["--shard", "0/2", "--parallel", "2", "--connect-timeout", "3", "--limit", "etcd"]
    result = runner.invoke(app, ["plan", str(cluster), *args])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "no controller state" in result.stderr


def test_verbose_shows_the_traceback_of_an_unexpected_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("engine.context.load", broken)  # cli.inventory imports it when called
    quiet = runner.invoke(app, ["inventory", "validate", str(tmp_path)])
    assert quiet.exit_code == ExitCode.ERROR
    assert quiet.stderr.strip().splitlines() == [
        "error: unexpected RuntimeError: boom (--verbose shows the traceback)"
    ]
    loud = runner.invoke(app, ["--verbose", "inventory", "validate", str(tmp_path)])
    assert isinstance(loud.exception, RuntimeError)


def test_kubespray_import_prints_no_gevent_traceback(tmp_path):
    """A fresh process: ansible-core probes socket.getaddrinfo when first imported, which
    printed a gevent traceback (the CLI runs under gevent's monkey patching)."""
    out = tmp_path / "cluster.yml"
    done = subprocess.run(
        [sys.executable, "-c", "from cli.main import app; app()", "inventory", "import"]
        + ["tests/unit/data/kubespray", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert out.exists()
    assert "Traceback" not in done.stderr and "getaddrinfo" not in done.stderr, done.stderr
