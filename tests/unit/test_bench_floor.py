"""The floor engine's comparison: one host's answers against the declared state, offline."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from benchmarks.floor import answer_digest, compare, remote_command

CONTENT = b"127.0.0.1 localhost\n"
DIGEST = hashlib.sha256(CONTENT).hexdigest()
FILES = [{"path": "/etc/hosts", "src": "/render/h1/etc/hosts", "mode": "0644",
          "user": "root", "group": "root"}]  # fmt: skip
HASHES = {"/render/h1/etc/hosts": DIGEST}
PACKAGES = ["chrony", "etcd-server=3.5.16-4"]


def answers(*, mode="644", owner="root\troot", digest=DIGEST, chrony="ii ", etcd="3.5.16-4"):
    return (
        f"stat\t/etc/hosts\t{mode}\t{owner}\n"
        f"hash\t{digest}  /etc/hosts\n"
        f"pkg\tchrony\t{chrony}\t4.6-1\n"
        f"pkg\tetcd-server\tii \t{etcd}\n"
    )


def test_a_host_in_the_declared_state_has_no_differences() -> None:
    assert compare(FILES, PACKAGES, answers(), HASHES) == []


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        ({"mode": "600"}, "/etc/hosts: mode 600, declared 0644"),
        ({"owner": "root\tadm"}, "/etc/hosts: owner root:adm"),
        ({"digest": "0" * 64}, "/etc/hosts: content differs"),
        ({"chrony": "rc "}, "package chrony: not installed"),
        ({"etcd": "3.5.15-1"}, "package etcd-server: version 3.5.15-1, declared 3.5.16-4"),
    ],
)
def test_each_difference_is_reported(changed: dict, expected: str) -> None:
    assert compare(FILES, PACKAGES, answers(**changed), HASHES) == [expected]


def test_a_missing_file_and_package_are_differences() -> None:
    assert compare(FILES, PACKAGES, "", HASHES) == [
        "/etc/hosts: missing",
        "package chrony: not installed",
        "package etcd-server: not installed",
    ]


def test_the_remote_command_answers_in_the_format_compare_reads(tmp_path) -> None:
    """The command runs here, in a local shell, on a real file: what the hosts' sh would run."""
    target = tmp_path / "hosts"
    target.write_bytes(CONTENT)
    target.chmod(0o644)
    owner = subprocess.run(["stat", "-c", "%U\t%G", str(target)], capture_output=True, text=True)
    files = [dict(FILES[0], path=str(target), user=owner.stdout.split("\t")[0],
                  group=owner.stdout.strip().split("\t")[1])]  # fmt: skip
    output = subprocess.run(
        ["sh", "-c", remote_command(files, [])], capture_output=True, text=True, check=True
    ).stdout
    assert compare(files, [], output, HASHES) == []
    target.write_bytes(b"changed\n")
    output = subprocess.run(
        ["sh", "-c", remote_command(files, [])], capture_output=True, text=True, check=True
    ).stdout
    assert compare(files, [], output, HASHES) == [f"{target}: content differs"]


def test_the_probe_answers_digest_masks_only_the_access_time_of_stat_lines() -> None:
    """What floor-probe compares moves with every field of the answer but stat's atime, the
    one field gpuinfra drift compares loosely too (engine/fingerprint/)."""
    line = b"user=root group=root mode=-rw-r--r-- atime=100 mtime=200 ctime=300 size=5 '/etc/x'\n"
    answer = b"m 0 0\n" + line + b"m stat 0\n"
    digest = answer_digest(answer)
    assert answer_digest(answer.replace(b"atime=100", b"atime=999")) == digest
    assert answer_digest(answer.replace(b"mtime=200", b"mtime=201")) != digest
    assert answer_digest(answer.replace(b"m 0 0", b"m 0 1")) != digest
    assert answer_digest(b"atime=1\n") != answer_digest(b"atime=2\n")


def test_floor_probe_ratios_are_paired_by_round() -> None:
    from benchmarks.report import markdown, summarize

    def run(engine: str, seconds: float) -> dict:
        return {"engine": engine, "seconds": seconds, "cpu_seconds": 0.1, "peak_tree_mib": 1.0,
                "max_process_mib": 1.0, "returncode": 0, "changes": 0, "load_before": 0.5,
                "machine_cpu_seconds": 2 * seconds}  # fmt: skip

    rounds = [(1.6, 0.9, 1.2), (1.8, 1.0, 1.2)]
    runs = [
        run(engine, seconds)
        for times in rounds
        for engine, seconds in zip(("gpuinfra", "floor", "floor-probe"), times, strict=True)
    ]
    entry = {"hosts": 12, "runs": runs, "operations_per_host": {"same_state": 80}}
    summary = summarize(entry)
    assert summary["ratios"]["gpuinfra_over_probe_floor"] == round((1.6 / 1.2 + 1.8 / 1.2) / 2, 2)
    assert summary["ratios"]["probe_floor_over_floor"] == round((1.2 / 0.9 + 1.2 / 1.0) / 2, 2)
    assert summary["engines"]["floor-probe"]["median_machine_cpu_seconds"] == 2.4
    text = markdown({"drift": {"12": entry}})
    assert "| 12 hosts | 12 | 80 | 1.79x | 1.42x | 1.27x |" in text


def test_the_work_above_the_connection_is_paired_by_round() -> None:
    from benchmarks.report import markdown, summarize

    def run(engine: str, seconds: float) -> dict:
        return {"engine": engine, "seconds": seconds, "cpu_seconds": 0.1, "peak_tree_mib": 1.0,
                "max_process_mib": 1.0, "returncode": 0, "changes": 0,
                "load_before": 0.5}  # fmt: skip

    # The last round's floor is below its connection alone (noise): it has no work to divide.
    rounds = [(1.5, 1.0, 0.5), (2.0, 1.0, 0.5), (1.5, 0.5, 0.75)]
    runs = [
        run(engine, seconds)
        for times in rounds
        for engine, seconds in zip(("gpuinfra", "floor", "connect"), times, strict=True)
    ]
    entry = {"hosts": 12, "runs": runs, "operations_per_host": {"same_state": 80}}
    ratios = summarize(entry)["ratios"]
    assert ratios["gpuinfra_over_floor_above_connect"] == 2.5  # (1.0 / 0.5 + 1.5 / 0.5) / 2
    assert ratios["connect_over_floor"] == 0.5  # median of 0.5, 0.5, 1.5
    assert "| 12 hosts | 12 | 80 | 2.00x | n/a | n/a | 0.50x | 2.50x |" in markdown(
        {"drift": {"12": entry}}
    )


def test_the_connect_engine_runs_true_on_every_host(monkeypatch) -> None:
    """Offline: `ask` (one ssh per host) is replaced by what it would hand back."""
    from benchmarks import floor

    asked = {}

    def ask(hosts: dict, remote: dict) -> dict:
        asked.update(remote)
        return {"h1": (0, b"", b""), "h2": (255, b"", b"ssh: connect to host h2: refused\n")}

    monkeypatch.setattr(floor, "ask", ask)
    hosts = {"addresses": {"h1": "127.0.0.2", "h2": "127.0.0.3"}}
    result = floor.check_connect(hosts)
    assert asked == {"h1": ("true", None), "h2": ("true", None)}
    assert result["hosts"]["h1"] == {"changes": 0, "differences": [], "error": None}
    assert "refused" in result["hosts"]["h2"]["error"]
