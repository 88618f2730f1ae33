"""The drift Job's host side (docs/design/fleet-jobs.md steps 1-2): the forced-command user's
files, the one firewall rule, the checks, and that an inventory without the Job is as before."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.context import ctx_host
from pyinfra.facts.files import Sha1File

from engine.context import host_context, load
from inventory.topology import pod_block
from lab.offline import GPUINFRA_BASE_PACKAGES
from roles.base.effective import sshd_findings
from roles.drift_job import deploy as drift_deploy
from roles.drift_job.files import KEYS_FILE, SSHD_CHECK, SSHD_DROPIN, SUDOERS, managed_files
from roles.drift_job.role import ports
from tests.helpers import files_of
from tests.unit.conftest import SAMPLE
from toolkit import driftprobe
from toolkit import operations as toolkit_operations

ENABLED = {"enabled": True, "nodes": ["cpu-1"]}


def with_job(small_cluster, write_cluster, kubernetes=None, **job) -> Any:
    settings: dict[str, Any] = {"drift_job": {**ENABLED, **job}}
    if kubernetes:
        settings["kubernetes"] = kubernetes
    small_cluster["group_vars"] = {"all": settings}
    return load(write_cluster(small_cluster))


def test_the_image_has_an_ssh_client():
    assert "openssh-client" in GPUINFRA_BASE_PACKAGES


def test_the_key_is_admitted_from_the_fleet_ops_nodes_and_their_pods_only(
    small_cluster, write_cluster
):
    loaded = with_job(small_cluster, write_cluster, sources=["192.0.2.7/32"])
    line = files_of(loaded, "etcd-1")[KEYS_FILE]
    assert line.startswith('restrict,from="10.0.0.71,10.128.0.0/12,192.0.2.7" ssh-ed25519 ')
    assert line.count("\n") == 1 and "command=" not in line


def test_under_routes_a_nodes_own_pods_are_its_pod_block(small_cluster, write_cluster):
    routes = {"cni": "routes", "routes_nat_outgoing": True}
    loaded = with_job(small_cluster, write_cluster, kubernetes=routes)
    block = pod_block(loaded.cluster, "cpu-1", 24)
    assert f'from="10.0.0.71,{block}"' in files_of(loaded, "dns-1")[KEYS_FILE]


def test_the_firewall_rule_is_on_the_fleet_ops_nodes_only(small_cluster, write_cluster):
    loaded = with_job(small_cluster, write_cluster)
    assert list(ports(loaded)) == ["host:cpu-1"]
    rule = "ip saddr 10.128.0.0/12 tcp dport 22 accept"
    tables = {name: files_of(loaded, name)["/etc/nftables.d/gpuinfra.nft"] for name in ("cpu-1",)}
    assert rule in tables["cpu-1"]
    for other in ("gpu-1", "cp-1", "etcd-1", "dns-1"):
        table = next(t for p, t in files_of(loaded, other).items() if p.endswith(".nft"))
        assert "drift Job" not in table and rule not in table


def test_sudoers_allows_the_wrapper_with_no_arguments_only(small_cluster, write_cluster):
    loaded = with_job(small_cluster, write_cluster)
    managed = files_of(loaded, "gpu-1", "drift_job", contents=False)
    text = managed[SUDOERS].content
    assert text.splitlines()[-1] == (f'gpuinfra-drift ALL=(root) NOPASSWD: {driftprobe.WRAPPER} ""')
    assert (managed[SUDOERS].mode, managed[SUDOERS].check) == ("0440", "visudo -cf {path}")
    assert managed[driftprobe.WRAPPER].mode == "0755"


def test_the_sshd_dropin_is_a_trailing_match_checked_with_the_live_config(
    small_cluster, write_cluster
):
    loaded = with_job(small_cluster, write_cluster)
    managed = files_of(loaded, "cp-1", "drift_job", contents=False)[SSHD_DROPIN]
    lines = [line.strip() for line in managed.content.splitlines() if not line.startswith("#")]
    assert lines[0] == "Match User gpuinfra-drift"
    assert "ForceCommand sudo -n /usr/local/sbin/gpuinfra-drift-probe" in lines
    assert {"DisableForwarding yes", "PermitTTY no", "PermitUserRC no"} <= set(lines)
    # H4: validated before it is live, together with what sshd reads now (put_checked stages
    # it beside the live file under a name sshd's *.conf Include does not read).
    assert managed.check == SSHD_CHECK
    assert "Include /etc/ssh/sshd_config" in SSHD_CHECK and "sshd -t -f" in SSHD_CHECK


def test_base_sshd_checks_ignore_the_match_block(small_cluster, write_cluster):
    loaded = with_job(small_cluster, write_cluster)
    ours = "/etc/ssh/sshd_config.d/50-gpuinfra.conf"
    ours_text = "PasswordAuthentication no\nX11Forwarding no\n"
    found = {
        "effective": {"passwordauthentication": ["no"], "x11forwarding": ["no"]},
        "files": ["/etc/ssh/sshd_config", ours, SSHD_DROPIN],
        "lines": [
            ("/etc/ssh/sshd_config", "include", "/etc/ssh/sshd_config.d/*.conf"),
            (ours, "passwordauthentication", "no"),
            (ours, "x11forwarding", "no"),
            (SSHD_DROPIN, "match", "User gpuinfra-drift"),
            (SSHD_DROPIN, "x11forwarding", "yes"),  # inside the Match: one user only
        ],
    }
    assert files_of(loaded, "cp-1")[SSHD_DROPIN]
    assert sshd_findings(found, ours, ours_text) == []


class Facts:
    def __init__(self, facts: dict):
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, fact, **arguments):
        return self.facts.get((fact, tuple(sorted(arguments.items()))))

    def noop(self, message):
        self.noops.append(message)


def test_the_effective_check_runs_after_the_reload_in_the_same_apply(
    small_cluster, write_cluster, monkeypatch
):
    """H4: sshd -T -C for the drift user hangs off the drop-in's change, after the reload."""
    loaded = with_job(small_cluster, write_cluster)
    ctx = host_context(loaded, "gpu-1")
    calls: list[tuple[str, dict]] = []

    class Meta:
        def __init__(self, path):
            self.path = path

        def did_change(self):
            return True

    monkeypatch.setattr(
        toolkit_operations, "put_file", lambda f: calls.append(("put", {})) or Meta(f.path)
    )
    for name in ("drift_account", "effective_now"):
        monkeypatch.setattr(drift_deploy, name, lambda _n=name, **kw: calls.append((_n, kw)))
    monkeypatch.setattr(
        toolkit_operations, "reload_sshd", lambda **kw: calls.append(("reload_sshd", kw))
    )
    monkeypatch.setattr(drift_deploy, "nothing_overrides", lambda *a: calls.append(("facts", {})))
    with ctx_host.use(Facts({})):
        drift_deploy.apply.__wrapped__(ctx)
    order = [name for name, _ in calls]
    assert order.index("reload_sshd") < order.index("effective_now")
    check = dict(calls)["effective_now"]
    assert check["_if"].__self__.path == SSHD_DROPIN
    assert "sshd -T -C user=gpuinfra-drift,addr=10.0.0.71,host=gpu-1 " in check["command"]
    assert "forcecommand sudo -n /usr/local/sbin/gpuinfra-drift-probe" in check["command"]


def test_the_fact_check_names_a_forced_command_sshd_does_not_apply():
    assert drift_deploy.sshd_findings(dict(drift_deploy.EXPECTED)) == []
    found = {**drift_deploy.EXPECTED, "forcecommand": "none"}
    assert drift_deploy.sshd_findings(found) == [
        "sshd: forcecommand for the drift user is 'none', not "
        "'sudo -n /usr/local/sbin/gpuinfra-drift-probe'"
    ]


@pytest.mark.parametrize(
    ("job", "key"),
    [
        ({"nodes": []}, "drift_job.nodes"),
        ({"nodes": ["etcd-1"]}, "drift_job.nodes"),
        ({"nodes": ["nope"]}, "drift_job.nodes"),
        ({"remove": True}, "drift_job.remove"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(small_cluster, write_cluster, job, key):
    from typer.testing import CliRunner

    from cli.main import app

    small_cluster["group_vars"] = {"all": {"drift_job": {**ENABLED, **job}}}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2, result.output
    assert key in result.stderr


def test_drift_job_settings_outside_group_vars_all_are_refused(small_cluster, write_cluster):
    from typer.testing import CliRunner

    from cli.main import app

    small_cluster["hosts"]["cpu-1"]["vars"] = {"drift_job": {"enabled": True}}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "hosts.cpu-1.vars.drift_job" in result.stderr


def test_routes_without_masquerade_is_refused_for_a_job(small_cluster, write_cluster):
    from typer.testing import CliRunner

    from cli.main import app

    routes = {"cni": "routes", "routes_nat_outgoing": False}
    small_cluster["group_vars"] = {"all": {"drift_job": ENABLED, "kubernetes": routes}}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "routes_nat_outgoing" in result.stderr


# -- dormant by default ----------------------------------------------------------------------


def test_without_the_job_no_host_gets_a_file_a_rule_or_an_operation(monkeypatch):
    """The sample inventory (no drift_job.enabled): nothing is written, no rule is added, and
    the deploy adds no operation and asks no fact, so every host's probe is as before."""
    loaded = load(SAMPLE / "cluster.yml")
    assert ports(loaded) == {}
    asked: list[str] = []

    class Refuse:
        def get_fact(self, *args, **kwargs):
            asked.append("fact")

        def noop(self, message):
            asked.append(message)

    for name in ("drift_account", "reload_sshd", "effective_now", "removed"):
        monkeypatch.setattr(drift_deploy, name, lambda *a, _n=name, **k: asked.append(_n))
    for name in ("put_file", "reload_sshd"):
        monkeypatch.setattr(toolkit_operations, name, lambda *a, _n=name, **k: asked.append(_n))
    for name in loaded.cluster.hosts:
        ctx = host_context(loaded, name)
        assert managed_files(ctx) == []
        assert not [
            f for f in files_of(loaded, name, contents=False).values() if f.role == "drift_job"
        ]
        with ctx_host.use(Refuse()):
            drift_deploy.apply.__wrapped__(ctx)
    assert asked == []


def test_remove_deletes_what_an_enabled_apply_installed(small_cluster, write_cluster, monkeypatch):
    loaded = with_job(small_cluster, write_cluster, enabled=False, remove=True, nodes=[])
    removed: list[str] = []
    monkeypatch.setattr(
        drift_deploy.files, "file", lambda **kw: removed.append(kw["path"]) or _Changed()
    )
    monkeypatch.setattr(drift_deploy.files, "directory", lambda **kw: removed.append(kw["path"]))
    monkeypatch.setattr(drift_deploy, "reload_sshd", lambda **kw: removed.append("reload"))
    monkeypatch.setattr(drift_deploy, "remove_account", lambda **kw: removed.append(kw["user"]))
    with ctx_host.use(Facts({})):
        drift_deploy.apply.__wrapped__(host_context(loaded, "etcd-1"))
    assert removed == [
        SSHD_DROPIN,
        "reload",
        SUDOERS,
        KEYS_FILE,
        driftprobe.WRAPPER,
        driftprobe.PROBE_DIR,
        "gpuinfra-drift",
    ]


class _Changed:
    def did_change(self):
        return True


def test_sha1_fact_names_the_live_dropin():
    assert drift_deploy._sha1("x") == "11f6ad8ec52a2984abaafd7c3b516503785c2072"
    assert Sha1File  # the fact the deploy reads before asking sshd (drop-in live)


def test_without_the_job_the_sample_renders_no_rule_and_no_probe_part():
    """Dormant: the sample inventory's firewall has no host's own rule, no host's files name the
    forced-command user, and drift's probe (a function of the recorded commands, which only
    the deploys' facts make) asks nothing of the Job's: the deploy asks no fact (above)."""
    from engine.context import host_contexts, host_files, topology_of
    from engine.fingerprint import probe_script

    loaded = load(SAMPLE / "cluster.yml")
    assert not [key for key in topology_of(loaded).firewall if key.startswith("host:")]
    for ctx in host_contexts(loaded):
        for managed in host_files(ctx):
            assert "gpuinfra-drift" not in managed.content, (ctx.name, managed.path)
    commands = ["sh -c 'echo a'"]
    assert driftprobe.PROBE_DIR not in probe_script(commands, "m")
    assert driftprobe.BEGIN not in probe_script(commands, "m")


def test_without_the_job_its_phase_is_on_no_host(small_cluster, write_cluster):
    """Off, the phase is on no host: no operation (not even the phase's `clear pending`), no
    role in any record. On, it is on every host."""
    from engine.fingerprint import host_roles
    from engine.registry import PHASES

    phase = next(p for p in PHASES if p.role == "drift_job")
    sample = load(SAMPLE / "cluster.yml")
    for host in sample.cluster.hosts.values():
        assert not phase.applies_to(host.groups, sample.cluster)
        assert "drift_job" not in host_roles(host.groups, cluster=sample.cluster)
    loaded = with_job(small_cluster, write_cluster)
    for host in loaded.cluster.hosts.values():
        assert "drift_job" in host_roles(host.groups, cluster=loaded.cluster)


def test_without_the_job_a_run_prepares_and_times_no_drift_job_phase(small_cluster, write_cluster):
    """Not even a `prepare:drift_job` of 0 s in the report's timings, and the phases keep the
    positions they had before the role had a phase."""
    from engine.registry import PHASES, select_phases

    sample = load(SAMPLE / "cluster.yml")
    off = select_phases((), sample.cluster)
    assert [p.role for p in off] == [p.role for p in PHASES if p.role != "drift_job"]
    on = select_phases((), with_job(small_cluster, write_cluster).cluster)
    assert [p.role for p in on] == [p.role for p in PHASES]


def test_a_dropin_sshd_refuses_is_never_live(small_cluster, write_cluster):
    """H4: the drop-in is staged where sshd does not read it, checked with what sshd reads
    now, and moved into place only when the check passes; a failing check removes it."""
    from toolkit.operations import put_checked, staged_path

    loaded = with_job(small_cluster, write_cluster)
    managed = files_of(loaded, "etcd-1", "drift_job", contents=False)[SSHD_DROPIN]
    with ctx_host.use(Facts({})):
        commands = [
            str(c)
            for c in put_checked._inner(
                content=managed.content, dest=managed.path, check=managed.check
            )
        ]
    staged = staged_path(SSHD_DROPIN)
    assert not staged.endswith(".conf")  # sshd's `Include sshd_config.d/*.conf` skips it
    check = next(i for i, c in enumerate(commands) if "sshd -t -f" in c)
    move = next(i for i, c in enumerate(commands) if f"mv -f {staged} {SSHD_DROPIN}" in c)
    assert check < move
    assert f'Include %s\\n" {staged}' in commands[check]
    assert f"|| {{ rc=$?; rm -f {staged}; exit $rc; }}" in commands[check]
