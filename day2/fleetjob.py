"""`gpuinfra drift --job`: the fleet's drift check as a Kubernetes Indexed Job
(docs/design/fleet-jobs.md, docs/fleet-jobs.md), run by the controller in kubeadm-style steps.

The controller computes every key, as local drift does; a shard only probes its hosts as the
forced-command user and compares digests (engine/fleetshard.py). Each host a shard cannot
settle (no probe, another key, an answer unlike its record, an ssh failure) is checked here,
exactly, with the operator's key, so the report and the exit code are local drift's. An index
that never reported is named and its hosts fail (exit 1).

Every kubectl runs on the first control-plane node with admin.conf, through
`toolkit.remote.run_remote` (the Secret with the drift key goes on stdin, never on a command
line). Nothing of the Job is left when the flow ends, whichever way it ends.

With `job_cluster` (`drift --job --job-cluster OTHER.yml`) the Job runs on another inventory's
cluster: its drift_job settings place the pods (nodes, image, namespace, resources, deadline)
and its first control-plane node runs kubectl, while the checked inventory gives the hosts, the
drift key, the user and the ssh settings (docs/design/fleet-jobs.md section 6).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace

from day2 import jobs
from day2.flows import DRIFT_JOB
from engine import fingerprint
from engine import fleetshard as shard_io
from engine.drift import ExactRun, merged_report
from engine.reports import HostReport, HostStatus, OperationResult, RunReport
from engine.selection import selected_hosts, shard_hosts
from inventory.model import LoadedCluster, StateAccess
from roles.drift_job.config import DriftJobConfig
from roles.drift_job.files import KEY
from roles.drift_job.role import fleet_config
from toolkit.jobs import job_tolerations
from toolkit.ssh import ssh_settings
from toolkit.statefiles import StateMissing
from toolkit.templates import render_template

# Kubernetes keeps one object (a ConfigMap: its data and binaryData together) under 1 MiB.
OBJECT_LIMIT = 1024 * 1024
OBJECT_OVERHEAD = 2048  # the object's metadata, labels and keys, generously
POLL_S = 2.0
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


# Another drift --job of the same cluster is running (exit 8, as a held lock).
FleetJobBusy = jobs.JobBusy


@dataclass
class JobRun(jobs.InClusterJob):
    """What the command was asked, and what each step found."""

    kind = "drift"
    command = "drift --job"

    run_exact: ExactRun
    _: KW_ONLY
    job_cluster: LoadedCluster | None = None  # where the Job runs; None: the checked cluster
    wall: Callable[[], float] = time.time  # epoch seconds, against the API server's stamps
    cfg: DriftJobConfig | None = None  # the checked inventory's: user, parallel, shards
    job_cfg: DriftJobConfig | None = None  # the Job's cluster's: nodes, image, namespace ...
    records: dict[str, fingerprint.Record] = field(default_factory=dict)  # on the sheet
    exact: dict[str, str] = field(default_factory=dict)  # host -> why the controller checks it
    sheets: list[tuple[str, str]] = field(default_factory=list)  # (sheet base64, known_hosts)
    answered: dict[str, shard_io.ShardHost] = field(default_factory=dict)
    usage: dict[int, dict] = field(default_factory=dict)  # index -> the shard's own rusage
    failed: dict[str, HostReport] = field(default_factory=dict)  # hosts of a silent shard
    exact_report: RunReport | None = None

    @property
    def namespace(self) -> str:
        assert self.job_cfg is not None
        return self.job_cfg.namespace

    @property
    def job_loaded(self) -> LoadedCluster:
        """The inventory of the cluster the Job runs on (kubectl on its first control plane)."""
        return self.job_cluster if self.job_cluster is not None else self.loaded


def fleet_drift(run: JobRun) -> RunReport:
    """The flow's steps in order, and the Job's objects deleted whatever happened."""
    check_options(run)
    return jobs.run_job_flow(DRIFT_JOB, run, delete)


def check_options(run: JobRun) -> None:
    loaded, options = run.loaded, run.options
    cfg = run.cfg = fleet_config(loaded)
    since = "an apply since, which installs the probes"
    jobs.refuse_unless_enabled(loaded, cfg.enabled, "drift --job", "drift_job", since)
    if options.roles or options.shard:
        raise jobs.JobRefused("drift --job checks every role of every host: no --roles, --shard")
    if loaded.cluster.ssh.bastion:
        raise jobs.JobRefused(
            f"{loaded.source}: ssh.bastion: the Job's pods connect from the cluster, not "
            "through the bastion; run drift without --job"
        )
    there = run.job_loaded
    if run.job_cluster is None:
        run.job_cfg = cfg
        if not cfg.nodes:
            raise jobs.JobRefused(
                f"{loaded.source}: drift_job.nodes is empty: this inventory's Job runs in "
                "another cluster (--job-cluster THAT_INVENTORY)"
            )
    else:
        run.job_cfg = fleet_config(there)
        if not run.job_cfg.enabled or not run.job_cfg.nodes:
            raise jobs.JobRefused(
                f"--job-cluster {there.source}: the Job's cluster needs "
                "group_vars.all.drift_job.enabled: true and its nodes"
            )
        if there.source == loaded.source:
            run.job_cluster = None  # the same inventory: a plain --job
    run.control_plane = jobs.first_control_plane(there, "drift --job")


# -- sheet -------------------------------------------------------------------------------------


def make_sheets(run: JobRun) -> None:
    """Which hosts a shard can settle (a record of the host's roles, an installed probe and the
    key still standing, as `Probes.finish` decides), split into shards, each with its sheet and
    only its own hosts' keys."""
    from engine.context import host_contexts

    loaded = run.loaded.with_state_access(StateAccess.existing)
    cfg = run.cfg
    assert cfg is not None
    run.hosts, run.notes = selected_hosts(loaded, run.options)
    for name in run.hosts:
        record = fingerprint.load_record(loaded.state_dir, name)
        if record is None:
            run.exact[name] = "no converged record"
        elif (
            fingerprint.host_roles(loaded.cluster.hosts[name].groups, cluster=loaded.cluster)
            != record.roles
        ):
            run.exact[name] = "other roles than its record"
        elif not record.probe_digest:
            run.exact[name] = "no drift Job probe installed"
        else:
            run.records[name] = record
    common = fingerprint.common_digest(loaded)
    rendered = [n for n, r in run.records.items() if not fingerprint.inputs_stand(r, common, n)]
    if rendered:
        contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}
        for name in rendered:
            if fingerprint.host_key(contexts[name], common) != run.records[name].key:
                run.exact[name] = "code, inventory or state changed since its record"
                del run.records[name]
    on_sheet = [name for name in run.hosts if name in run.records]
    count = min(shard_count(run, len(on_sheet)), len(on_sheet))
    known = jobs.known_hosts_text(loaded)
    settings = {
        "user": cfg.user,
        "port": ssh_settings(loaded).port,
        "parallel": cfg.parallel,
        "timeout": run.options.connect_timeout,
    }
    for index in range(count):
        mine = shard_hosts(on_sheet, index, count)
        entries = [
            (n, str(loaded.cluster.hosts[n].address), run.records[n].probe_digest) for n in mine
        ]
        sheet = base64.b64encode(shard_io.shard_sheet(run.run, index, count, settings, entries))
        keys = known_hosts_for(known, [_host_pattern(a, settings["port"]) for _, a, _ in entries])
        size = len(sheet) + len(keys.encode()) + OBJECT_OVERHEAD
        if size > OBJECT_LIMIT:
            wanted = math.ceil(count * size / (OBJECT_LIMIT - OBJECT_OVERHEAD)) + 1
            raise jobs.JobRefused(
                f"shard {index}/{count}: its ConfigMap would hold {size:,} bytes (the sheet and "
                f"the host keys of its {len(mine)} hosts), over Kubernetes' 1 MiB limit for one "
                f"object: run with more shards (--shards {wanted})"
            )
        run.sheets.append((sheet.decode(), keys))
        run.shard_of.append(mine)


def shard_count(run: JobRun, hosts: int) -> int:
    assert run.cfg is not None
    if run.count is not None:
        return run.count
    return run.cfg.shards or max(1, math.ceil(hosts / run.cfg.hosts_per_shard))


def _host_pattern(address: str, port: int) -> str:
    """How ssh names a host in known_hosts: the address, or [address]:port off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def known_hosts_for(text: str, patterns: list[str]) -> str:
    """The lines of a known_hosts file that name one of `patterns`, plain or hashed
    (`|1|salt|hash`, HashKnownHosts), markers (@cert-authority, @revoked) kept."""
    wanted = set(patterns)
    kept = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        names = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        if any(_names(name, wanted) for name in names.split(",")):
            kept.append(line)
    return "".join(f"{line}\n" for line in kept)


def _names(name: str, wanted: set[str]) -> bool:
    if not name.startswith("|1|"):
        return name in wanted
    try:
        _, _, salt, digest = name.split("|")
        key, expected = base64.b64decode(salt), base64.b64decode(digest)
    except ValueError:
        return False
    return any(
        hmac.compare_digest(hmac.new(key, p.encode(), hashlib.sha1).digest(), expected)
        for p in wanted
    )


# -- publish, wait, collect -----------------------------------------------------------------------


def job_manifest(run: JobRun) -> str:
    """The Namespace, ServiceAccount, Secret, each shard's ConfigMap, the NetworkPolicy (Calico)
    and the Job, as one YAML stream (it holds the drift key: stdin only)."""
    from toolkit.spec import settings_of

    loaded, cfg, there = run.loaded, run.job_cfg, run.job_loaded
    assert cfg is not None
    calico = any(settings_of(there, n, "kubernetes").cni == "calico" for n in cfg.nodes)
    return render_template(
        "drift_job/fleet-job.yaml.j2",
        cfg=cfg,
        cluster_name=loaded.cluster.name,
        run=run.run,
        labels=run.labels(),
        key_base64=jobs.key_base64(KEY, loaded),
        shards=[{"sheet": sheet, "known_hosts": keys} for sheet, keys in run.sheets],
        tolerations=job_tolerations(there, cfg),
        network_policy=calico,
        egress=[str(loaded.cluster.networks.node)],
        port=ssh_settings(loaded).port,
    )


def publish(run: JobRun) -> None:
    if not run.sheets:
        return  # no host a shard could settle: the controller checks them all
    try:
        manifest = job_manifest(run)
    except StateMissing as exc:
        raise jobs.JobRefused(f"{exc}: apply with drift_job.enabled first") from None
    run.refuse_a_running_job(run.wall())
    run.apply_job(manifest)


def wait(run: JobRun) -> None:
    """Until the Job is Complete or Failed, or past its deadline and a margin."""
    if not run.sheets:
        return
    assert run.job_cfg is not None
    run.wait_for_job(run.job_cfg.deadline_seconds, POLL_S)


def collect(run: JobRun) -> None:
    """Each index's report from its succeeded pod's log, taken only when its sha256, run, shard
    and hosts are the termination message's and the sheet's; an index without one is named."""
    if not run.sheets:
        return
    text = run.kubectl("list the Job's pods", f"get pods -l job-name={run.name} -o json")
    try:
        pods = json.loads(text).get("items", [])
    except ValueError:
        raise jobs.JobError(f"collect: kubectl get pods of {run.name} printed no JSON") from None
    count = len(run.sheets)
    by_index: dict[int, list[dict]] = {}
    for pod in pods:
        index = pod.get("metadata", {}).get("annotations", {}).get(INDEX_ANNOTATION, "")
        if index.isdigit():
            by_index.setdefault(int(index), []).append(pod)
    for index in range(count):
        mine = by_index.get(index, [])
        if run.completed(index) and not any(_succeeded(pod) for pod in mine):
            # Its pod ended 0 and is gone, its log with it (deleted once it ended, its node
            # lost): the Job counts the shard done, and nothing says what it found.
            for name in run.shard_of[index]:
                run.exact[name] = f"shard {index}/{count} succeeded, its pod and report gone"
            continue
        found = _shard_report(run, index, count, mine)
        if isinstance(found, str):
            for name in run.shard_of[index]:
                run.failed[name] = HostReport(name, HostStatus.failed, error=found)
            continue
        for name, status, reason, seconds in found["hosts"]:
            run.answered[name] = shard_io.ShardHost(name, status, reason, seconds)
        if isinstance(found.get("rusage"), dict):
            run.usage[index] = found["rusage"]


def _shard_report(run: JobRun, index: int, count: int, pods: list[dict]) -> dict | str:
    """The index's report, or why it has none (the text the report's failed hosts carry)."""
    label = f"shard {index}/{count}"
    succeeded = [p for p in pods if _succeeded(p)]
    if not succeeded:
        history = "; ".join(_pod_story(pod) for pod in pods) or "no pod ran"
        return f"{label} did not report: {history}{run.index_end(index)}"
    pod = succeeded[-1]
    name = pod["metadata"]["name"]
    logs = run.kubectl_result(f"logs {shlex.quote(name)} -c drift")
    if not logs.ok:
        raise jobs.JobError(
            f"collect: kubectl logs of {label} (pod {name}) on {run.control_plane} failed: "
            f"{logs.tail(300)}"
        )
    lines = [line for line in logs.stdout.splitlines() if line.strip()]
    line = lines[-1].strip().encode() if lines else b""
    message = _termination_message(pod)
    try:
        said = json.loads(message)
    except ValueError:
        return f"{label} did not report: pod {name} left no termination message"
    if said.get("sha256") != hashlib.sha256(line).hexdigest():
        return f"{label}: report refused: its log's sha256 is not the one pod {name} ended with"
    try:
        report = shard_io.read_report(line)
    except ValueError as exc:
        return f"{label}: report refused: {exc}"
    expected = run.shard_of[index]
    if (report.get("run"), report.get("shard"), report.get("count")) != (run.run, index, count):
        return f"{label}: report refused: another run's or shard's (pod {name})"
    if [entry[0] for entry in report.get("hosts", [])] != expected:
        return f"{label}: report refused: its hosts are not its sheet's (pod {name})"
    return report


def _succeeded(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Succeeded"


def _termination_message(pod: dict) -> str:
    for status in pod.get("status", {}).get("containerStatuses", []):
        if status.get("name") == "drift":
            return status.get("state", {}).get("terminated", {}).get("message", "")
    return ""


def _pod_story(pod: dict) -> str:
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status", {})
    conditions = {c.get("type"): c for c in status.get("conditions", [])}
    if conditions.get("DisruptionTarget", {}).get("status") == "True":
        why = conditions["DisruptionTarget"].get("reason", "disrupted")
        return f"pod {name} {why} (DisruptionTarget, not counted)"
    for container in status.get("containerStatuses", []):
        ended = container.get("state", {}).get("terminated")
        if ended:
            return f"pod {name} exit {ended.get('exitCode')} {ended.get('reason', '')}".rstrip()
    return f"pod {name} {status.get('phase', 'unknown').lower()}"


# -- exact, merge, delete ------------------------------------------------------------------------


def exact(run: JobRun) -> None:
    """The hosts no shard settled, checked operation by operation with the operator's key."""
    from engine.clusterstate import require_state

    for name, answer in run.answered.items():
        if answer.status != shard_io.MATCHED:
            run.exact[name] = f"{answer.status} in its shard ({answer.reason})"
    rest = [name for name in run.hosts if name in run.exact]
    if rest:
        loaded = require_state(run.loaded, ())
        options = replace(run.options, limit=tuple(rest), shard=None)
        run.exact_report = run.run_exact(loaded, options)
    else:
        run.exact_report = RunReport(cluster=run.loaded.cluster.name, mode=run.options.mode)


def merge(run: JobRun) -> None:
    """One report as local drift makes it: a matched host's from its record (as
    fingerprint.check `_matched` builds it), the others' from the exact check or the silence
    of their shard."""
    from engine.fingerprint import FastCheck

    fast = FastCheck(started=run.started)
    for name, answer in run.answered.items():
        if answer.status == shard_io.MATCHED:
            record = run.records[name]
            fast.reports[name] = HostReport(
                name,
                HostStatus.ok,
                operations=[OperationResult(role, op, False) for role, op in record.operations],
                seconds=answer.seconds,
                reboot_required=record.reboot_required,
                notes=list(record.notes),
            )
    fast.reports.update(run.failed)
    fast.exact = dict(run.exact)
    fast.seconds = run.clock() - run.started
    assert run.exact_report is not None
    report = merged_report(
        run.loaded.cluster.name, run.hosts, run.notes, fast, run.exact_report, run.started
    )
    settled = sum(1 for a in run.answered.values() if a.status == shard_io.MATCHED)
    report.notes.insert(
        len(run.notes),
        f"drift --job: {len(run.sheets)} shard(s) settled {settled} of {len(run.hosts)} hosts; "
        f"{len(run.exact)} checked by the controller{named(run.exact)}, {len(run.failed)} in "
        "shards that did not report",
    )
    at = len(run.notes) + 1
    for index in sorted(run.usage):
        usage = {"hosts": len(run.shard_of[index]), **run.usage[index]}
        report.notes.insert(at, usage_note(index, len(run.sheets), usage))
        at += 1
    run.report = report


NAMED_AT_MOST = 5  # hosts named in the note; a fleet's thousands would drown it


def named(exact: dict[str, str]) -> str:
    """The first hosts left to the controller and why, for the note: " (gpu-1: why; ...)"."""
    if not exact:
        return ""
    shown = [f"{name}: {why}" for name, why in sorted(exact.items())[:NAMED_AT_MOST]]
    more = len(exact) - len(shown)
    return " (" + "; ".join(shown) + (f"; {more} more" if more else "") + ")"


USAGE_NOTE = "drift --job: shard {index}/{count} used "


def usage_note(index: int, count: int, usage: dict) -> str:
    """What a shard said it cost itself (its rusage, self and children, and its pod's memory
    peak where the cgroup shows it): one note per shard, its JSON after the prefix, which the
    benchmark reads back (`read_usage_notes`)."""
    return USAGE_NOTE.format(index=index, count=count) + json.dumps(usage, sort_keys=True)


def read_usage_notes(notes: list[str]) -> dict[int, dict]:
    """index -> usage, from a report's notes (`usage_note`'s inverse)."""
    found: dict[int, dict] = {}
    for note in notes:
        head, _, rest = note.partition(" used ")
        words = head.split()
        if not note.startswith("drift --job: shard ") or len(words) != 4 or not rest:
            continue
        index = words[3].split("/")[0]
        try:
            found[int(index)] = json.loads(rest)
        except ValueError:
            continue
    return found


def delete(run: JobRun) -> None:
    """The run's Job, ConfigMaps, Secret and NetworkPolicy (the namespace and its service
    account stay for the next run). A failure here is a note, not the run's result."""
    run.add_notes(run.delete_objects("job,configmap,secret,networkpolicy"))
