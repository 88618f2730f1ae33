"""day2/steps.py, the step runner of the day-2 flows: order, a failure that names its step and
the state it left, skipping or running one step alone where that is safe, a step an earlier run
finished, and the listing `--help` shows for every flow command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from day2 import flows
from day2.flows import (
    ETCD_REPLACE,
    ETCD_RESTORE,
    ETCD_ROTATE_CA,
    KUBERNETES_CERTS_RENEW,
    KUBERNETES_NODE_ADD,
    KUBERNETES_NODE_REMOVE,
    KUBERNETES_UPGRADE,
)
from day2.steps import Flow, Step, run_flow
from toolkit.remote import RemoteResult

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
            Step("third", "the third", step("third"), alone=True),
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
        "  third   the third (--only)",
    ]


def test_only_runs_one_step_alone_where_that_is_safe():
    flow, done = recording_flow()
    heard: list[str] = []
    reports = run_flow(flow, object(), error=Failed, only="third", progress=heard.append)
    assert done == ["third"] and heard == ["[third] the third"]
    assert [(r.name, r.status) for r in reports] == [("third", "done")]
    with pytest.raises(ValueError, match=r"^demo: step first cannot run alone \(alone: third\)$"):
        run_flow(flow, object(), error=Failed, only="first")
    with pytest.raises(ValueError, match="no step 'fourth'"):
        run_flow(flow, object(), error=Failed, only="fourth")
    with pytest.raises(ValueError, match="--only runs one step; it takes no --skip"):
        run_flow(flow, object(), error=Failed, only="third", skip=["second"])
    assert done == ["third"]  # a refused --only runs nothing


def test_a_step_an_earlier_run_finished_is_reported_not_run_again():
    ran: list[str] = []
    flow = Flow(
        "demo",
        (
            Step("made", "made before", ran.append, done=lambda context: True),
            Step("todo", "still to do", ran.append, done=lambda context: False),
        ),
    )
    heard: list[str] = []
    reports = run_flow(flow, "context", error=Failed, progress=heard.append)
    assert ran == ["context"] and [r.status for r in reports] == ["already done", "done"]
    assert heard == ["[made] already done: made before", "[todo] still to do"]


FLOWS = [value for value in vars(flows).values() if isinstance(value, Flow)]


def test_every_day2_command_flow_is_declared_and_has_a_command_here():
    """The flows whose commands take --skip and --only, each in COMMANDS below."""
    assert {flow.name for flow in FLOWS} >= {" ".join(command) for command, _, _ in COMMANDS}


@pytest.mark.parametrize("flow", FLOWS, ids=lambda flow: flow.name)
def test_every_step_of_every_flow_names_code_that_exists(flow):
    from day2.steps import _resolve

    for step in flow.steps:
        for code in (step.run, step.left, step.done):
            if code is not None:
                assert callable(_resolve(code)), step.name


# Every command that runs a flow, with its arguments and --yes where it asks.
COMMANDS = [
    (["etcd", "replace"], ["{c}", "etcd-2", "--yes"], ETCD_REPLACE),
    (["etcd", "restore"], ["{c}", "{snap}", "--yes"], ETCD_RESTORE),
    (["etcd", "rotate-ca"], ["{c}", "--yes"], ETCD_ROTATE_CA),
    (["kubernetes", "certs", "renew"], ["{c}", "--yes"], KUBERNETES_CERTS_RENEW),
    (["kubernetes", "upgrade"], ["{c}", "1.36.0", "--yes"], KUBERNETES_UPGRADE),
    (["kubernetes", "node", "add"], ["{c}", "cpu-1"], KUBERNETES_NODE_ADD),
    (["kubernetes", "node", "remove"], ["{c}", "cpu-1", "--yes"], KUBERNETES_NODE_REMOVE),
]


COMMAND_IDS = [" ".join(command) for command, _, _ in COMMANDS]


@pytest.mark.parametrize(("command", "arguments", "flow"), COMMANDS, ids=COMMAND_IDS)
def test_help_lists_each_step_with_its_description(command, arguments, flow):
    result = CliRunner().invoke(app, [*command, "--help"])  # 80 columns: each step on its line
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in result.output.splitlines()]
    assert " Steps, in order:" in lines
    for step in flow.steps:
        # Indented under the heading, its description and marks on the same line.
        shown = step.description + step.marks
        listed = (line.startswith(f"   {step.name} ") and line.endswith(shown) for line in lines)
        assert any(listed), step.name
    assert "--skip" in result.output and "--only" in result.output


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


# ---------------------------------------------------------------- --skip and --only, every command


def _refused_step(names: list[str], allowed: list[str]) -> str:
    return next(name for name in names if name not in allowed)


@pytest.mark.parametrize(("command", "arguments", "flow"), COMMANDS, ids=COMMAND_IDS)
@pytest.mark.parametrize("option", ["--skip", "--only"])
def test_every_flow_command_refuses_a_step_it_may_not_leave_out_or_run_alone(
    monkeypatch, loaded, tmp_path, command, arguments, flow, option
):
    """Exit 2 with the flow, the step and the steps it would take, before the lock and the
    flow: a step that needs the ones before it never runs alone."""
    from day2 import etcd
    from day2 import kubernetes as kubernetes_day2

    def never(*args, **kwargs):
        raise AssertionError("the flow must not run")

    for name in ("replace", "restore", "rotate_ca"):
        monkeypatch.setattr(etcd, name, never)
    for name in ("renew_certificates", "upgrade", "add_nodes", "remove_node"):
        monkeypatch.setattr(kubernetes_day2, name, never)
    snapshot = tmp_path / "snap.db"
    snapshot.write_bytes(b"snapshot")
    values = {"c": str(loaded.source), "snap": str(snapshot)}
    allowed = flow.skippable if option == "--skip" else flow.alone
    step = _refused_step(flow.names, allowed)
    argv = [*command, *(a.format(**values) for a in arguments), option, step]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    verb, listed = ("cannot be skipped", "skippable") if option == "--skip" else (
        "cannot run alone", "alone")  # fmt: skip
    said = f"{flow.name}: step {step} {verb} ({listed}: {', '.join(allowed) or 'none'})"
    assert said in result.stderr and "Traceback" not in result.output


def test_only_with_skip_is_refused_before_anything(monkeypatch, loaded):
    from day2 import etcd

    monkeypatch.setattr(etcd, "replace", lambda *a, **k: pytest.fail("the flow must not run"))
    argv = ["etcd", "replace", str(loaded.source), "etcd-2", "--yes"]
    result = CliRunner().invoke(app, [*argv, "--only", "preflight", "--skip", "gate"])
    assert result.exit_code == 2
    assert "etcd replace: --only runs one step; it takes no --skip" in result.stderr


@pytest.fixture
def locked_cluster(tmp_path, monkeypatch):
    """The loopback cluster with its CA, whose member trusts it: a changing command gets
    through the lock and the pre-apply checks (as in test_day2_lock)."""
    from inventory.loader import load
    from roles.etcd import trust
    from roles.etcd.pki import ensure_pki, local_ca_fingerprint
    from tests.unit.loopback import loopback_cluster

    folder = loopback_cluster(tmp_path / "loop")
    ensure_pki(load(folder))
    fingerprint = local_ca_fingerprint(load(folder))
    monkeypatch.setattr(trust, "read_live_ca", lambda loaded, host: trust.LiveCA(host, fingerprint))
    return folder


@pytest.mark.parametrize("output", ["table", "json"])
def test_only_runs_the_step_alone_and_says_so(monkeypatch, locked_cluster, output):
    from day2 import kubernetes as kubernetes_day2

    asked: list[dict] = []

    def remove_node(loaded, node, force, **kwargs):
        asked.append(kwargs)
        return kubernetes_day2.Outcome("node remove cpu-1")

    monkeypatch.setattr(kubernetes_day2, "remove_node", remove_node)
    argv = ["kubernetes", "node", "remove", str(locked_cluster), "cpu-1", "--yes", "-f", output]
    result = CliRunner().invoke(app, [*argv, "--only", "read"])
    assert result.exit_code == 0, result.output
    assert [(a["only"], a["skip"]) for a in asked] == [("read", [])]
    if output == "json":
        said = json.loads(result.stdout)
        assert said["flow"] == "kubernetes node remove" and said["step"] == "read"
        assert said["status"] == "done"
    else:
        assert result.stdout.startswith("kubernetes node remove: step read done in ")


def test_replace_preflight_alone_changes_nothing(monkeypatch, loaded):
    from day2 import etcd
    from day2.etcd import common
    from tests.unit.test_etcd_hardening import Members

    members = Members()
    monkeypatch.setattr(common, "run_remote", members)
    heard: list[str] = []
    etcd.replace(loaded, "etcd-2", stamp="S", only="preflight", progress=heard.append)
    assert heard == [f"[preflight] {ETCD_REPLACE.steps[0].description}"]
    assert members.sent("member list")  # control: the preflight asked the cluster
    assert not members.sent("systemctl stop etcd") and not members.sent("member remove")


# ---------------------------------------------------------------- the ported flows


@pytest.fixture
def kubernetes_loaded(small_cluster, load_small):

    small_cluster["hosts"]["cp-3"] = {"address": "10.0.0.23", "groups": ["control_plane"]}
    small_cluster["hosts"]["cpu-2"] = {"address": "10.0.0.72", "groups": ["cpu_worker"]}
    return load_small()


def test_node_remove_read_alone_sends_only_the_read(kubernetes_loaded):
    from day2 import kubernetes as kubernetes_day2
    from tests.unit.test_kubernetes_day2 import Recorder

    runner = Recorder()
    outcome = kubernetes_day2.remove_node(kubernetes_loaded, "cpu-2", runner=runner, only="read")
    assert [c.action for c in outcome.steps] == ["read cpu-2"] and len(runner.calls) == 1
    assert outcome.notes == []  # not removed: no note to take it out of the inventory


def test_a_failed_node_remove_step_names_itself_and_the_state_it_left(kubernetes_loaded):
    from day2 import kubernetes as kubernetes_day2
    from tests.unit.test_kubernetes_day2 import Recorder

    heard: list[str] = []
    with pytest.raises(kubernetes_day2.KubernetesOperationError) as failed:
        kubernetes_day2.remove_node(
            kubernetes_loaded,
            "cpu-2",
            runner=Recorder(fail_on="kubeadm reset"),
            progress=heard.append,
        )
    assert str(failed.value).startswith("step reset: cpu-2: kubeadm reset failed: boom; ")
    assert "the Node object is deleted, the host not reset" in str(failed.value)
    assert heard[-1] == "[reset] kubeadm reset on the node"


def test_a_deleted_node_reports_the_steps_done_before(kubernetes_loaded):
    from day2 import kubernetes as kubernetes_day2
    from tests.unit.test_kubernetes_day2 import Recorder

    heard: list[str] = []
    kubernetes_day2.remove_node(
        kubernetes_loaded, "cpu-2", runner=Recorder(node=""), progress=heard.append
    )
    assert [line.split("]")[0] + "]" for line in heard if "already done" in line] == [
        "[cordon]",
        "[drain]",
        "[delete]",
    ]


def test_a_failed_renewal_names_its_step_and_the_nodes_renewed(kubernetes_loaded):
    from day2 import kubernetes as kubernetes_day2
    from tests.unit.test_kubernetes_day2 import Recorder

    class FailOnCp2(Recorder):
        def __call__(self, loaded, host, command, timeout):
            if host == "cp-2" and "renew all" in command:
                self.calls.append((host, command))
                return RemoteResult(host, 1, "", "boom")
            return super().__call__(loaded, host, command, timeout)

    runner = FailOnCp2()
    with pytest.raises(kubernetes_day2.KubernetesOperationError) as failed:
        kubernetes_day2.renew_certificates(kubernetes_loaded, runner=runner)
    assert str(failed.value) == (
        "step renew: cp-2: renew certificates failed: boom; nodes renewed and restarted before "
        "it: cp-1; the nodes after it were not touched"
    )
    assert not any(host == "cp-3" for host, _ in runner.calls)
    checked = kubernetes_day2.renew_certificates(
        kubernetes_loaded, runner=Recorder(), only="check-expiration"
    )
    assert [c.action for c in checked.steps] == ["check certificate expiry"]


def test_rotate_ca_reports_the_steps_a_stopped_run_finished(monkeypatch, loaded):
    from day2 import etcd
    from day2.etcd import certs
    from roles.etcd import pki

    pki.ensure_pki(loaded)
    pki.begin_ca_rotation(loaded)  # a run that stopped after trust-new
    monkeypatch.setattr(
        certs,
        "_roll_out",
        lambda loaded, step: etcd.CaRotationStep(step, {}, {}, "healthy", 0.0),
    )
    heard: list[str] = []
    result = etcd.rotate_ca(loaded, progress=heard.append)
    assert [s.step for s in result.steps] == ["reissue", "drop-old"]
    assert heard[0].startswith("[trust-new] already done: ")
    assert heard[1:] == ["[reissue] " + ETCD_ROTATE_CA.steps[1].description,
                         "[drop-old] " + ETCD_ROTATE_CA.steps[2].description]  # fmt: skip
