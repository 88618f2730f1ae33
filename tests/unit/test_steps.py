"""day2/steps.py, the step runner of the day-2 flows: order, a failure that names its step and
the state it left, skipping where that is safe, and the listing `--help` shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from day2.flows import ETCD_REPLACE, ETCD_RESTORE, KUBERNETES_UPGRADE
from day2.steps import Flow, Step, run_flow

REPO = Path(__file__).resolve().parents[2]


class Failed(RuntimeError):
    pass


class Refused(Failed):
    pass


def recording_flow(fail: str | None = None, error: type[Exception] = Failed):
    done: list[str] = []

    def step(name: str):
        def run(context):
            done.append(name)
            if name == fail:
                raise error(f"{name} went wrong")

        return run

    def left(context):
        done.append("left")
        return "half done, run it again"

    flow = Flow(
        "demo",
        (
            Step("first", "the first", step("first")),
            Step("second", "the second", step("second"), left=left, skippable=True),
            Step("third", "the third", step("third")),
        ),
    )
    return flow, done


def test_steps_run_in_order_and_each_is_reported():
    flow, done = recording_flow()
    heard: list[str] = []
    reports = run_flow(flow, object(), error=Failed, progress=heard.append)
    assert done == ["first", "second", "third"]
    assert [(r.name, r.status) for r in reports] == [
        ("first", "done"),
        ("second", "done"),
        ("third", "done"),
    ]
    assert heard == ["[first] the first", "[second] the second", "[third] the third"]


def test_a_failed_step_names_itself_and_the_state_it_left():
    flow, done = recording_flow(fail="second")
    with pytest.raises(Failed) as failed:
        run_flow(flow, object(), error=Failed)
    assert str(failed.value) == "step second: second went wrong; half done, run it again"
    assert done == ["first", "second", "left"]  # its `left` ran; the next step did not


def test_a_refusal_stays_a_refusal_and_a_step_without_left_adds_nothing():
    flow, done = recording_flow(fail="first", error=Refused)
    with pytest.raises(Refused, match=r"^step first: first went wrong$"):
        run_flow(flow, object(), error=Failed)
    assert done == ["first"]


def test_an_unexpected_exception_is_not_dressed_up_as_a_step_failure():
    def broken(context):
        raise KeyError("bug")

    flow = Flow("demo", (Step("only", "the only one", broken, left=lambda c: "never"),))
    with pytest.raises(KeyError):
        run_flow(flow, object(), error=Failed)


def test_skip_leaves_out_only_the_steps_marked_safe():
    flow, done = recording_flow()
    heard: list[str] = []
    reports = run_flow(flow, object(), error=Failed, skip=["second"], progress=heard.append)
    assert done == ["first", "third"]
    assert [r.status for r in reports] == ["done", "skipped", "done"]
    assert "[second] skipped: the second" in heard
    with pytest.raises(ValueError, match="step first cannot be skipped .skippable: second."):
        run_flow(flow, object(), error=Failed, skip=["first"])
    with pytest.raises(ValueError, match="no step 'fourth' .steps: first, second, third."):
        run_flow(flow, object(), error=Failed, skip=["fourth"])
    assert done == ["first", "third"]  # a bad --skip runs nothing


def test_step_names_are_unique():
    with pytest.raises(ValueError, match="two steps share a name"):
        Flow("demo", (Step("a", "x", print), Step("a", "y", print)))


def test_the_listing_is_the_flows_steps_in_order():
    flow, _ = recording_flow()
    assert flow.help().splitlines() == [
        "Steps, in order:",
        "  first   the first",
        "  second  the second (--skip)",
        "  third   the third",
    ]


@pytest.mark.parametrize("flow", [ETCD_REPLACE, ETCD_RESTORE, KUBERNETES_UPGRADE])
def test_every_step_of_every_flow_names_code_that_exists(flow):
    from day2.steps import _resolve

    for step in flow.steps:
        assert callable(_resolve(step.run)), step.name
        if step.left is not None:
            assert callable(_resolve(step.left)), step.name


@pytest.mark.parametrize(
    ("argv", "flow"),
    [
        (["etcd", "replace", "--help"], ETCD_REPLACE),
        (["etcd", "restore", "--help"], ETCD_RESTORE),
        (["kubernetes", "upgrade", "--help"], KUBERNETES_UPGRADE),
    ],
)
def test_help_lists_each_step_with_its_description(argv, flow):
    result = CliRunner().invoke(app, argv)  # 80 columns: each step fits on its line
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    for step in flow.steps:
        shown = step.description + (" (--skip)" if step.skippable else "")
        assert any(line.startswith(step.name) and line.endswith(shown) for line in lines), step.name


def test_listing_the_steps_loads_no_flow():
    """--help builds every command's help from day2.flows: that must not import the flows (or
    the inventory's model, which they need)."""
    script = (
        "import sys; import day2.flows; "
        "print(sorted(m for m in ('day2.etcd', 'day2.kubernetes', 'pydantic') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------- the flows on stand-in hosts


@pytest.fixture
def loaded(small_cluster, write_cluster):
    from engine.context import load

    return load(write_cluster(small_cluster))


def test_replace_names_the_failed_step_and_skips_the_gate_when_asked(monkeypatch, loaded):
    from day2 import etcd
    from day2.etcd import common
    from tests.unit.test_etcd_hardening import Members

    members = Members(fail={"systemctl stop etcd": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(etcd.EtcdOperationError, match=r"^step stop: etcd-2: could not stop"):
        etcd.replace(loaded, "etcd-2", stamp="S")
    # Control: the same replace with the gate skipped sends no fio and reports no gate.
    skipped = Members()
    monkeypatch.setattr(common, "run_remote", skipped)
    heard: list[str] = []
    result = etcd.replace(loaded, "etcd-2", stamp="S", skip=["gate"], progress=heard.append)
    assert result.gate is None and not skipped.sent("fio")
    assert skipped.sent("member promote")
    assert heard[0].startswith("[preflight] ") and "[gate] skipped: " in heard[3]
    ran = Members()
    monkeypatch.setattr(common, "run_remote", ran)
    assert etcd.replace(loaded, "etcd-2", stamp="S").gate is not None and ran.sent("fio")


def test_restore_without_clean_up_keeps_the_old_data(monkeypatch, loaded, tmp_path):
    from day2 import etcd
    from day2.etcd import common, restore_flow
    from tests.unit.test_etcd_hardening import Members

    snapshot = tmp_path / "snap.db"
    snapshot.write_bytes(b"snapshot")
    healthy = etcd.ClusterStatus("small", "healthy", 2, 3, None, 0)
    monkeypatch.setattr(restore_flow, "status", lambda loaded: healthy)
    kept = Members()
    monkeypatch.setattr(common, "run_remote", kept)
    etcd.restore(loaded, snapshot, stamp="S", skip=["clean-up"])
    assert kept.sent("etcd-wait-healthy")
    assert not kept.sent("rm -rf /var/lib/etcd/member.before-restore-S")
    cleaned = Members()
    monkeypatch.setattr(common, "run_remote", cleaned)
    etcd.restore(loaded, snapshot, stamp="S")
    assert cleaned.sent("rm -rf /var/lib/etcd/member.before-restore-S")


@pytest.mark.parametrize(
    ("skip", "said"),
    [
        ("remove", "etcd replace: step remove cannot be skipped (skippable: gate, clean-up)"),
        ("nope", "etcd replace: no step 'nope'"),
    ],
)
def test_the_command_refuses_a_step_it_may_not_skip_before_anything(
    monkeypatch, loaded, skip, said
):
    from day2 import etcd

    def never(*args, **kwargs):
        raise AssertionError("the flow must not run")

    monkeypatch.setattr(etcd, "replace", never)
    result = CliRunner().invoke(
        app, ["etcd", "replace", str(loaded.source), "etcd-2", "--yes", "--skip", skip]
    )
    assert result.exit_code == 2
    assert said in result.stderr and "Traceback" not in result.output
