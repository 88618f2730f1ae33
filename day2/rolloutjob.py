"""`gpuinfra apply --job`: a worker rollout as a Kubernetes Indexed Job (docs/design/fleet-jobs.md
section 5, docs/fleet-jobs.md), run by the controller in kubeadm-style steps.

Each shard's pod applies its share of the workers with the operator's runner, asking a shared
ledger (engine/fleetgate.py `LedgerGate`) before each step, so never more than the budget of
hosts is in flight fleet-wide, and pacing its joins by time slots (toolkit/pacing.py
`SlotPacer`), so the join rate holds fleet-wide. The controller holds the apply lock while it
waits; the ledger's heartbeat is the lock inside the cluster (engine/clusterstate.py).

Only batch-policy groups roll this way: a host of a group that rolls one at a time or together
(etcd, control plane, load balancers, DNS) is refused, exit 2, naming the group. Every kubectl
runs on the first control-plane node with admin.conf (`toolkit.remote.run_remote`); the key
and the join token go on stdin, never on a command line. Nothing of the Job is left at the end.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import yaml

from day2 import jobs
from day2.flows import ROLLOUT_JOB
from engine import fleetgate
from engine.context import host_contexts, host_files
from engine.incluster import ADMIN_CONF, remote_kubectl
from engine.orchestrate import group_policies
from engine.registry import PHASES
from engine.reports import HostReport, HostStatus, RunReport
from engine.rolloutlock import ledger_name
from engine.selection import select_hosts, shard_hosts
from inventory.model import LoadedCluster, StateAccess
from roles.base.effective import controller_public_key
from roles.rollout_job.config import RolloutJobConfig
from roles.rollout_job.files import KEY
from roles.rollout_job.role import fleet_config
from toolkit.jobs import job_tolerations
from toolkit.spec import Rolling, settings_of
from toolkit.ssh import ssh_settings
from toolkit.statefiles import StateMissing, recording_reads
from toolkit.templates import render_template

# Bump when settings.json or what the pod is given changes (2: the state Secret): a skewed pod
# exits 2.
SETTINGS_FORMAT = 2
POLL_S = 5.0
# Roles whose worker files carry a key derived from .state/ (drift's and the rollout's own),
# which stays on the controller: they are applied by a local apply, never by the Job.
STATE_KEYED_ROLES = ("drift_job", "rollout_job")
# Where the pod finds what the Job mounts (templates/rollout_job/rollout-job.yaml.j2).
POD_DIR = "/etc/gpuinfra/rollout"
# The key as the Secret mounts it (0440, group 65532), and the copy the inventory names: ssh and
# the inventory's check refuse a key its group may read (engine/rolloutshard.py copies it).
MOUNTED_KEY = "/etc/gpuinfra/rollout-key/id_ed25519"
POD_KEY = "/run/gpuinfra/id_ed25519"
# A worker whose clock is ahead of the operator's by up to this still admits a new certificate.
CERT_BACKDATE_S = 300
# The state entries the selected workers' files read (`gather_state`), as one JSON document
# {path under .state/: content} (a Secret's keys cannot hold "/"); engine/rolloutshard.py
# stages them into the pod's own state folder.
STATE_SECRET = "gpuinfra-rollout-state"
MOUNTED_STATE = "/etc/gpuinfra/rollout-state/state.json"
# The Secrets the Job owns: the garbage collector deletes them with it, however the run ends.
OWNED_SECRETS = ("gpuinfra-rollout-ssh", "gpuinfra-rollout-join", STATE_SECRET)
# kubeadm's join command, as `kubeadm token create --print-join-command` prints it.
_JOIN_COMMAND = re.compile(r"--token\s+(\S+).*--discovery-token-ca-cert-hash\s+(sha256:[0-9a-f]+)")
# The token outlives the Job's deadline by this much: a pod started late can still join.
TOKEN_MARGIN_S = 600
# A shard told to stop finishes the step in progress first (engine/rolloutshard.py): a package
# install or a paced join, within this.
SHARD_GRACE_S = 600


@dataclass
class Rollout(jobs.InClusterJob):
    """What the command was asked, and what each step found."""

    kind = "rollout"
    command = "apply --job"

    _: KW_ONLY
    clock: Callable[[], float] = time.time  # epoch seconds: the ledger's heartbeat is one
    cfg: RolloutJobConfig | None = None
    roles: tuple[str, ...] = ()
    token: str = ""  # the join token: in memory, then in the Secret only
    # This run's key and its certificate: in memory, then in the Secret only
    identity: tuple[str, str] = ("", "")
    # What the pods get of .state/ (path under it -> content): in memory, then in the Secret only
    state: dict[str, str] = field(default_factory=dict)
    ca_hash: str = ""
    progress: list[dict] = field(default_factory=list)  # each shard's {pods, hosts}
    ledger: fleetgate.Ledger | None = None
    # pod -> its last log lines, read before the run deletes the Job (and the pods with it)
    last_lines: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The Job's and its ledger's: a local apply reads it as the lock (rolloutlock)."""
        return ledger_name(self.loaded.cluster.name)

    @property
    def namespace(self) -> str:
        assert self.cfg is not None
        return self.cfg.namespace


def fleet_rollout(rollout: Rollout) -> RunReport:
    """The flow's steps in order; the Job's objects and the token deleted however it ends."""
    check_options(rollout)
    return jobs.run_job_flow(ROLLOUT_JOB, rollout, delete)


def check_options(rollout: Rollout) -> None:
    """Exit 2 for what a Job cannot do: not enabled, a bastion, a host of a group that does not
    roll in batches (named), a role whose files need .state/, no control-plane node."""
    loaded, options = rollout.loaded, rollout.options
    cfg = rollout.cfg = fleet_config(loaded)
    since = "a local apply since, which admits the rollout key on the workers"
    jobs.refuse_unless_enabled(loaded, cfg.enabled, "apply --job", "rollout_job", since)
    if loaded.cluster.ssh.bastion:
        raise jobs.JobRefused(f"{loaded.source}: ssh.bastion: the Job's pods cannot use it")
    if options.shard:
        raise jobs.JobRefused("apply --job shards the hosts itself: no --shard (use --shards)")
    refuse_unbatched(loaded, options.limit)
    keyed = sorted(set(options.roles) & set(STATE_KEYED_ROLES))
    if keyed:
        raise jobs.JobRefused(
            f"--roles {', '.join(keyed)}: these roles' files carry a key from .state/, which "
            "the Job's pods never get; apply them without --job"
        )
    known = {phase.role for phase in PHASES}
    rollout.roles = options.roles or tuple(
        sorted(known - set(STATE_KEYED_ROLES), key=[p.role for p in PHASES].index)
    )
    rollout.control_plane = jobs.first_control_plane(loaded, "apply --job")


def refuse_unbatched(loaded: LoadedCluster, limit: tuple[str, ...]) -> None:
    """JobRefused naming the first group of the selected hosts that rolls one at a time or
    together (its members' rules hold inside one run, which a Job's shards are not)."""
    policies = group_policies(PHASES)
    for name in select_hosts(loaded, limit):
        for group in loaded.cluster.hosts[name].groups:
            policy = policies.get(group, Rolling.batches)
            if policy is not Rolling.batches:
                raise jobs.JobRefused(
                    f"--limit reaches {name} of the group {group}, which rolls "
                    f"{policy.value.replace('_', ' ')}: apply --job rolls batch-policy groups "
                    "only (e.g. --limit gpu_worker); apply the others without --job"
                )


# -- plan, token, publish --------------------------------------------------------------------


def make_shards(rollout: Rollout) -> None:
    assert rollout.cfg is not None
    rollout.hosts = select_hosts(rollout.loaded, rollout.options.limit)
    if not rollout.hosts:
        raise jobs.JobRefused("--limit selects no host")
    count = min(rollout.count or rollout.cfg.shards, len(rollout.hosts))
    rollout.shard_of = [shard_hosts(rollout.hosts, i, count) for i in range(count)]


def gather_state(rollout: Rollout) -> None:
    """The state entries the selected roles' files read on the selected hosts, and nothing
    else: each host's files rendered once here, role by role, recording what they read of
    .state/. An entry goes to the pods only when that host's own files hold its value (a
    cephx client key in its keyring, the fsid in ceph.conf), so a pod holds nothing its
    workers do not; one they do not hold (an authority, a CA's key) is refused, naming it.
    Recorded are the reads of `kept_secret`; a file that read state any other way would find
    it missing in the pod (StateMissing, the host failed), never receive it unchecked."""
    loaded = rollout.loaded.with_state_access(StateAccess.existing)
    selected = set(rollout.hosts)
    rollout.state = {}
    for ctx in host_contexts(loaded):
        if ctx.name not in selected:
            continue
        for role in rollout.roles:
            with recording_reads() as reads:
                try:
                    held = [managed.content for managed in host_files(ctx, (role,))]
                except StateMissing as exc:
                    raise jobs.JobRefused(
                        f"{role}'s files on {ctx.name} read {exc.path}, which is missing: "
                        "apply the cluster without --job first"
                    ) from None
            for relative in sorted(reads):
                value = (loaded.state_dir / relative).read_text()
                if not any(value.strip() in content for content in held):
                    raise jobs.JobRefused(
                        f"{role}'s files on {ctx.name} read .state/{relative}, which no file of "
                        f"{ctx.name} holds: it never leaves the controller; apply {role} without "
                        "--job"
                    )
                rollout.state[relative] = value


def mint_token(rollout: Rollout) -> None:
    """A join token on cp-1 with a TTL past the Job's deadline (kubeadm prints the join command,
    which the controller reads; the token never goes on a command line here). Nothing is made
    while another run's Job is running (JobBusy): its objects have this run's names."""
    assert rollout.cfg is not None
    rollout.refuse_a_running_job(rollout.clock())
    ttl = f"{rollout.cfg.deadline_seconds + TOKEN_MARGIN_S}s"
    result = rollout.runner(
        rollout.loaded,
        rollout.control_plane,
        f"kubeadm token create --kubeconfig {ADMIN_CONF} --ttl {ttl} --print-join-command",
        timeout=120,
    )
    match = _JOIN_COMMAND.search(result.stdout) if result.ok else None
    if match is None:
        raise jobs.JobError(
            f"token: kubeadm on {rollout.control_plane} made no join token "
            f"(exit {result.exit_code}: {result.last_line()})"
        )
    rollout.token, rollout.ca_hash = match[1], match[2]


def certify_key(rollout: Rollout) -> None:
    """A key for this run only, certified by the rollout authority (.state/, never sent) from
    a little before now until the token's end: past the Job's deadline the workers refuse it,
    whether or not the run's objects were ever deleted."""
    assert rollout.cfg is not None
    now = int(rollout.clock())
    valid = (now - CERT_BACKDATE_S, now + rollout.cfg.deadline_seconds + TOKEN_MARGIN_S)
    try:
        rollout.identity = KEY.run_identity(rollout.loaded, rollout.cfg, rollout.run, valid)
    except StateMissing as exc:
        raise jobs.JobRefused(f"{exc}: apply with rollout_job.enabled first") from None


def pod_inventory(loaded: LoadedCluster) -> str:
    """The inventory as the pods read it: the rollout key as root, the known_hosts beside it.
    The operator's key, which the inventory declares as its ssh.key, stays declared: its
    public half joins base.authorized_keys wherever that list is set (and for every host), or
    the base role in a pod would find it on the hosts as a key nobody declared."""
    data = yaml.safe_load(Path(loaded.source).read_text())
    ssh = dict(data.get("ssh") or {})
    key = loaded.resolve(loaded.cluster.ssh.key) if loaded.cluster.ssh.key is not None else None
    operator = controller_public_key(key) if key is not None else None
    ssh.update({"user": "root", "key": POD_KEY, "known_hosts": f"{POD_DIR}/known_hosts"})
    ssh.pop("bastion", None)
    data["ssh"] = ssh
    if operator is not None:
        group_vars = data.setdefault("group_vars", {})
        every = group_vars.setdefault("all", {}).setdefault("base", {})
        bases = [every, *(v["base"] for v in group_vars.values() if v and "base" in v)]
        bases += [h["vars"]["base"] for h in data["hosts"].values() if "base" in h.get("vars", {})]
        for base in {id(b): b for b in bases}.values():
            if base is every or "authorized_keys" in base:
                base["authorized_keys"] = [*base.get("authorized_keys", []), operator]
    return yaml.safe_dump(data, sort_keys=False)


def pod_settings(rollout: Rollout) -> dict:
    assert rollout.cfg is not None
    first = rollout.hosts[0]
    return {
        "format": SETTINGS_FORMAT,
        "run": rollout.run,
        "cluster": rollout.loaded.cluster.name,
        "namespace": rollout.namespace,
        "ledger": rollout.name,
        "count": len(rollout.shard_of),
        "shards": rollout.shard_of,
        "roles": list(rollout.roles),
        "join_rate": settings_of(rollout.loaded, first, "kubernetes").join_rate,
        "parallel": rollout.options.parallel,
        "connect_timeout": rollout.options.connect_timeout,
    }


def job_manifest(rollout: Rollout) -> str:
    """Every object of the Job as one YAML stream (it holds the key and the token: stdin only)."""
    loaded, cfg = rollout.loaded, rollout.cfg
    assert cfg is not None
    private, cert = rollout.identity
    known = jobs.known_hosts_text(loaded)
    ledger = fleetgate.Ledger(
        run=rollout.run,
        budget=cfg.budget,
        total=len(rollout.hosts),
        fail_percent=cfg.fail_percent
        if rollout.options.fail_percent is None
        else rollout.options.fail_percent,
        heartbeat=rollout.clock(),
    )
    join = json.dumps({"token": rollout.token, "ca_cert_hash": rollout.ca_hash})
    count = len(rollout.shard_of)
    return render_template(
        "rollout_job/rollout-job.yaml.j2",
        cfg=cfg,
        cluster_name=loaded.cluster.name,
        run=rollout.run,
        count=count,
        ledger=rollout.name,
        writable=[rollout.name, *(f"{rollout.name}-{i}" for i in range(count))],
        labels=rollout.labels(),
        key_base64=_base64(private.strip() + "\n"),
        cert_base64=_base64(cert.strip() + "\n"),
        join_base64=base64.b64encode(join.encode()).decode(),
        state_secret=STATE_SECRET,
        state_base64=_base64(json.dumps(rollout.state, sort_keys=True)),
        inventory=pod_inventory(loaded),
        known_hosts=known,
        settings=json.dumps(pod_settings(rollout)),
        ledger_json=ledger.dump()[fleetgate.LEDGER_KEY],
        tolerations=job_tolerations(loaded, cfg),
        grace_seconds=SHARD_GRACE_S,
        network_policy=any(settings_of(loaded, n, "kubernetes").cni == "calico" for n in cfg.nodes),
        egress=[str(loaded.cluster.networks.node)],
        ports=[ssh_settings(loaded).port, loaded.cluster.api.port],
    )


def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def publish(rollout: Rollout) -> None:
    """The objects, the Job suspended until the Secrets are its own (their owner's uid exists
    only once it does): no pod holds the key before the collector would delete it."""
    rollout.apply_job(job_manifest(rollout))
    uid = rollout.kubectl(
        "read the Job's uid", f"get job {rollout.name} -o jsonpath={{.metadata.uid}}"
    )
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": rollout.name,
        "uid": uid.strip(),
    }
    patch = shlex.quote(json.dumps({"metadata": {"ownerReferences": [owner]}}))
    for secret in OWNED_SECRETS:
        rollout.kubectl(
            f"make {secret} the Job's", f"patch secret {secret} --type merge -p {patch}"
        )
    resume = shlex.quote(json.dumps({"spec": {"suspend": False}}))
    rollout.kubectl("start the Job", f"patch job {rollout.name} --type merge -p {resume}")


# -- wait, collect, delete -------------------------------------------------------------------


def wait(rollout: Rollout) -> None:
    """Until the Job is Complete or Failed (or past its deadline), renewing the ledger's
    heartbeat meanwhile: a join can outlast the heartbeat's 120 s without any shard writing."""
    assert rollout.cfg is not None
    api = ledger_api(rollout)
    renewed = 0.0

    def renew() -> None:
        nonlocal renewed
        if rollout.clock() - renewed >= fleetgate.HEARTBEAT_RENEW_S:
            renewed = now = rollout.clock()
            try:
                fleetgate.swap(api, rollout.name, lambda ledger: fleetgate.renew(ledger, now))
            except fleetgate.LedgerError as exc:
                raise jobs.JobError(f"wait: the ledger's heartbeat: {exc}") from None

    rollout.wait_for_job(rollout.cfg.deadline_seconds, POLL_S, renew)


def ledger_api(rollout: Rollout) -> fleetgate.KubectlApi:
    """The ledger and the shards' progress, read and written by kubectl on cp-1."""
    return fleetgate.KubectlApi(
        rollout.namespace,
        remote_kubectl(rollout.loaded, rollout.control_plane, rollout.namespace, rollout.runner),
    )


def collect(rollout: Rollout) -> None:
    """Each shard's progress and the ledger, read back; the hosts' statuses from them."""
    api = ledger_api(rollout)
    try:
        data, _ = api.get(rollout.name)
        rollout.ledger = fleetgate.Ledger.parse(data)
    except fleetgate.LedgerError as exc:
        raise jobs.JobError(f"collect: {exc}") from None
    rollout.progress = []
    for index in range(len(rollout.shard_of)):
        try:
            found, _ = api.get(f"{rollout.name}-{index}")
        except fleetgate.LedgerError as exc:
            raise jobs.JobError(f"collect: shard {index}'s progress: {exc}") from None
        try:
            rollout.progress.append(json.loads(found.get(fleetgate.PROGRESS_KEY) or "{}"))
        except ValueError:
            rollout.progress.append({})
    read_failed_pods(rollout)
    rollout.report = rollout_report(rollout)


# Lines of a failed shard's pod kept in the report: its last host's error and what led to it.
POD_LINES = 20


def read_failed_pods(rollout: Rollout) -> None:
    """The last lines of each pod whose shard ended a host failed, read now: the run deletes
    the Job and its pods however it ends, and `kubectl logs` afterwards finds nothing."""
    for progress in rollout.progress:
        ends = progress.get("hosts", {}).values()
        pods = progress.get("pods", [])
        if not pods or not any(end in fleetgate.FAILED_ENDS for end in ends):
            continue
        pod = pods[-1]
        result = rollout.kubectl_result(f"logs {shlex.quote(pod)} --tail={POD_LINES}")
        rollout.last_lines[pod] = (
            result.stdout.strip()
            if result.ok
            else f"(its log could not be read: {result.stderr.strip()[-200:] or 'gone'})"
        )


def rollout_report(rollout: Rollout) -> RunReport:
    """One host report per host: its end as its shard wrote it; a host left in flight or never
    tried failed (its shard ended without it) or skipped (the ledger stopped)."""
    assert rollout.ledger is not None
    report = RunReport(cluster=rollout.loaded.cluster.name, mode=rollout.options.mode)
    stopped = rollout.ledger.stopped
    for index, hosts in enumerate(rollout.shard_of):
        progress = rollout.progress[index]
        ends = progress.get("hosts", {})
        pods = progress.get("pods", [])
        label = f"shard {index}/{len(rollout.shard_of)}"
        if len(pods) > 1:
            report.notes.append(
                f"{label} was retried: pods {', '.join(pods)} (the later ones resumed from its "
                "progress)"
            )
        for name in hosts:
            end = ends.get(name)
            if end in {s.value for s in HostStatus} and end != HostStatus.skipped.value:
                error = (
                    f"failed in {label}; the last lines of its pod {pods[-1]}:\n"
                    f"{rollout.last_lines.get(pods[-1], '(not read)')}"
                    if pods
                    else ""
                )
                failed = end in fleetgate.FAILED_ENDS
                report.hosts[name] = HostReport(
                    name, HostStatus(end), error=error if failed else None
                )
            elif stopped and end is None:
                report.hosts[name] = HostReport(
                    name, HostStatus.skipped, error=f"not tried: {stopped}"
                )
            else:
                why = "left in flight" if end == fleetgate.IN_FLIGHT else "never tried"
                report.hosts[name] = HostReport(
                    name,
                    HostStatus.failed,
                    error=f"{label} ended with this host {why}{rollout.index_end(index)}",
                )
    if stopped:
        report.stopped = stopped
    report.notes.append(
        f"apply --job: {len(rollout.shard_of)} shard(s), budget {rollout.ledger.budget}, "
        f"{len(rollout.ledger.done)} done, {len(rollout.ledger.failed)} failed of "
        f"{rollout.ledger.total}; at most {most_in_flight(rollout.ledger)} host(s) in flight "
        "at once (the ledger's history)"
    )
    report.seconds = time.monotonic() - rollout.started
    return report


def most_in_flight(ledger: fleetgate.Ledger) -> int:
    """The most hosts the ledger's history had in flight at one moment (an adoption moves a
    host to another pod; it stays in flight). The history is in the order of the writes that
    made it, each a compare-and-swap: the order they happened in."""
    flying: set[str] = set()
    most = 0
    for _, _, event, host in ledger.history:
        if event == "start":
            flying.add(host)
        elif event == "end":
            flying.discard(host)
        most = max(most, len(flying))
    return most


def delete(rollout: Rollout) -> None:
    """The Job, its Secrets (the key, the token, the state entries), ConfigMaps and RBAC, and
    the token itself on cp-1 (by its id, the public half). A failure here is a note, not the
    run's result."""
    problems = rollout.delete_objects("job,configmap,secret,role,rolebinding")
    if rollout.token:
        token_id = rollout.token.split(".")[0]
        result = rollout.runner(
            rollout.loaded,
            rollout.control_plane,
            f"kubeadm token delete --kubeconfig {ADMIN_CONF} {shlex.quote(token_id)}",
            timeout=120,
        )
        if not result.ok:
            problems.append(
                f"the join token {token_id} was not deleted on {rollout.control_plane} "
                f"(it expires by its TTL): {result.last_line()}"
            )
    rollout.add_notes(problems)
