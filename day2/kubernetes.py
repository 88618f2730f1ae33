"""Day-2 operations on a kubeadm cluster: status, certificate renewal, upgrades one minor at a
time, and adding or removing nodes.

A layer above the engine (it calls `engine.runner` for `node add`), kept out of the role's deploy
path: the deploy never imports this module. Commands run on the nodes over SSH (host keys
checked, as everywhere): kubectl with admin.conf on the first control-plane node, kubeadm on
the node it acts on. Every step is recorded in order; the first failing step stops the
operation and names the node, so a bad upgrade stops on one node with the others untouched.
The order follows kubeadm's documented procedures (and Kubespray's): `upgrade apply` on the
first control-plane node, `upgrade node` on the others one at a time, then workers cordoned,
drained, upgraded and uncordoned in batches no larger than the budget. Certificate renewal,
upgrades and node add and remove are the flows of `day2.flows` (`KUBERNETES_*`); each step
records the commands it sends in the operation's `Outcome`.
"""

from __future__ import annotations

import base64
import json
import math
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from day2.steps import run_flow
from engine.context import host_contexts
from engine.reports import Mode, RunOptions, RunReport
from engine.runner import run
from inventory.model import LoadedCluster
from inventory.versions import KubernetesVersion, kubernetes_needs, release_key
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.kubeadm import ADMIN_CONF, PATCHES_DIR, cluster_configuration
from roles.kubernetes.models import dump
from roles.kubernetes.operations import binary_url, checked_download
from roles.kubernetes.settings import CONFIG_DIR, first_control_plane
from toolkit.remote import RemoteRunner, run_remote
from toolkit.spec import host_config

KUBECTL = f"kubectl --kubeconfig {ADMIN_CONF} --request-timeout=30s"
# The node's own API server, not admin.conf's endpoint: through the balancer, another node's API
# server answers while this one is still down or has not restarted yet (seen on the lab).
HEALTHZ = f"{KUBECTL} --server https://127.0.0.1:6443 get --raw /readyz"
MANIFESTS = "/etc/kubernetes/manifests"
# kube-apiserver, kube-controller-manager and kube-scheduler listen here while they run.
CONTROL_PLANE_PORTS = (6443, 10257, 10259)


class KubernetesOperationError(RuntimeError):
    """A day-2 operation stopped; the message says on which node and why."""


@dataclass
class Command:
    """One command an operation sent to a node, as its result table shows it."""

    host: str
    action: str
    ok: bool = True
    detail: str = ""


@dataclass
class Outcome:
    operation: str
    steps: list[Command] = field(default_factory=list)  # named so for `--format json`
    notes: list[str] = field(default_factory=list)


@dataclass
class KubernetesRun:
    """One day-2 operation as its flow's steps see it: the cluster, how commands reach the
    nodes, and the outcome that records each command in order."""

    loaded: LoadedCluster
    runner: RemoteRunner
    outcome: Outcome

    def attempt(
        self, host: str, action: str, command: str, timeout: float = 600, stdin: bytes | None = None
    ):
        """Run and record one command (`stdin` sent to it: a secret never goes on a command
        line); (ok, stdout, or the end of stderr) without raising."""
        fed = {"stdin": stdin} if stdin is not None else {}
        result = self.runner(self.loaded, host, command, timeout=timeout, **fed)
        if result.ok:
            self.outcome.steps.append(Command(host, action))
            return True, result.stdout
        said = result.stderr.strip()[-500:] or f"exit {result.exit_code}"
        self.outcome.steps.append(Command(host, action, False, said))
        return False, said

    def command(
        self, host: str, action: str, command: str, timeout: float = 600, stdin: bytes | None = None
    ) -> str:
        """Run and record one command; its stdout, or KubernetesOperationError naming the node."""
        ok, output = self.attempt(host, action, command, timeout, stdin)
        if not ok:
            raise KubernetesOperationError(f"{host}: {action} failed: {output}")
        return output


def _first(loaded: LoadedCluster) -> str:
    try:
        return first_control_plane(loaded.cluster)
    except ValueError as exc:
        raise KubernetesOperationError(f"{loaded.source}: {exc}") from None


def _wait(command: str, seconds: int = 300) -> str:
    return (
        f"for i in $(seq {seconds}); do {command} >/dev/null 2>&1 && exit 0; sleep 1; done; exit 1"
    )


# ---------------------------------------------------------------- status


@dataclass
class NodeStatus:
    name: str
    ready: bool
    version: str
    taints: list[str]
    unschedulable: bool


@dataclass
class ClusterStatus:
    cluster: str
    nodes: list[NodeStatus]
    certificates: list[str]  # kubeadm certs check-expiration, one line per certificate


def parse_nodes(text: str) -> list[NodeStatus]:
    nodes = []
    for item in json.loads(text or "{}").get("items", []):
        conditions = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
        taints = [
            f"{t['key']}={t.get('value', '')}:{t['effect']}"
            for t in item.get("spec", {}).get("taints", [])
        ]
        nodes.append(
            NodeStatus(
                name=item["metadata"]["name"],
                ready=conditions.get("Ready") == "True",
                version=item.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", "?"),
                taints=taints,
                unschedulable=bool(item.get("spec", {}).get("unschedulable")),
            )
        )
    return nodes


def status(loaded: LoadedCluster, runner: RemoteRunner = run_remote) -> ClusterStatus:
    asking = KubernetesRun(loaded, runner, Outcome("status"))
    first = _first(loaded)
    nodes = parse_nodes(asking.command(first, "list nodes", f"{KUBECTL} get nodes -o json"))
    expiry = asking.command(first, "check certificate expiry", "kubeadm certs check-expiration")
    lines = [line for line in expiry.splitlines() if line.strip()]
    return ClusterStatus(loaded.cluster.name, nodes, lines)


# ---------------------------------------------------------------- certificates


def restart_control_plane(
    job: KubernetesRun, host: str, meanwhile: Callable[[], None] | None = None
) -> None:
    """kubeadm's documented restart of static pods: take their manifests away until kubelet
    has stopped them (it looks every 20 s: wait until none of their ports listens, rather than
    a fixed sleep), do `meanwhile` (a kubelet upgrade), put them back, wait until this node's
    API server is ready. Each pod stops as kubelet stops a pod, so the API server fails /readyz
    and serves through its shutdown delay while the balancers take it out of rotation."""
    away = "/etc/kubernetes/manifests.gpuinfra-away"
    job.command(
        host, "stop the control-plane pods", f"mkdir -p {away} && mv {MANIFESTS}/*.yaml {away}/"
    )
    ports = " or ".join(f"sport = :{port}" for port in CONTROL_PLANE_PORTS)
    stopped, _ = job.attempt(
        host, "wait for the pods to stop", _wait(f"! ss -ltnH '( {ports} )' | grep -q .", 120), 180
    )
    try:
        if stopped and meanwhile is not None:
            meanwhile()
    finally:
        # Back in place whatever happened: a node left without its manifests serves nothing.
        job.command(
            host, "start the control-plane pods", f"mv {away}/*.yaml {MANIFESTS}/ && rmdir {away}"
        )
    if not stopped:
        raise KubernetesOperationError(
            f"{host}: kubelet did not stop the control-plane pods within 120 s; their "
            "manifests are back in place and nothing else was done on it"
        )
    job.command(host, "wait for /healthz", _wait(HEALTHZ))


@dataclass
class RenewRun(KubernetesRun):
    """One `kubernetes certs renew`: the nodes renewed so far."""

    renewed: list[str] = field(default_factory=list)


def renew_certificates(
    loaded: LoadedCluster,
    runner: RemoteRunner = run_remote,
    *,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """The steps of `day2.flows.KUBERNETES_CERTS_RENEW`: check-expiration, then `kubeadm certs
    renew all` and a control-plane restart on each control-plane node in turn; the next node
    starts only after this one answers /healthz."""
    from day2.flows import KUBERNETES_CERTS_RENEW

    job = RenewRun(loaded, runner, Outcome("certs renew"))
    run_flow(
        KUBERNETES_CERTS_RENEW,
        job,
        error=KubernetesOperationError,
        skip=skip,
        only=only,
        progress=progress,
    )
    return job.outcome


def renew_check_expiration(job: RenewRun) -> None:
    job.command(_first(job.loaded), "check certificate expiry", "kubeadm certs check-expiration")


def renew_control_plane(job: RenewRun) -> None:
    for host in job.loaded.cluster.in_group("control_plane"):
        job.command(host, "renew certificates", "kubeadm certs renew all")
        restart_control_plane(job, host)
        job.renewed.append(host)


def renew_left(job: RenewRun) -> str:
    renewed = ", ".join(job.renewed) or "none"
    return f"nodes renewed and restarted before it: {renewed}; the nodes after it were not touched"


# ---------------------------------------------------------------- upgrades


def check_upgrade_step(current: str, target: str) -> None:
    """One minor at a time (kubeadm refuses skipping one): 1.31.x -> 1.31.y or 1.32.z."""
    try:
        have, want = KubernetesVersion.parse(current), KubernetesVersion.parse(target)
    except ValueError as exc:
        raise KubernetesOperationError(f"upgrade {current} -> {target}: {exc}") from None
    if want.major != have.major or want.minor - have.minor not in (0, 1):
        raise KubernetesOperationError(
            f"upgrade {current} -> {target}: one minor version at a time "
            f"(next: {have.major}.{have.minor + 1}.x)"
        )
    if want <= have:
        raise KubernetesOperationError(f"upgrade {current} -> {target}: not newer")


def batch_size(workers: int, budget_percent: float) -> int:
    """Workers drained at once: the budget's share of them, at least one."""
    return max(1, math.floor(workers * budget_percent / 100))


def package_commands(loaded: LoadedCluster, host: str, version: str, names: list[str]) -> str:
    """Install the target version's kubeadm, kubelet or kubectl on a node: packages held again
    after, release binaries checked against the inventory's pins for that version
    (kubernetes.release_sha256), or nothing where the host image provides them (preinstalled)."""
    cfg = host_config(loaded, host, "kubernetes", KubernetesConfig)
    if cfg.source == "preinstalled":
        return "true"
    plain = KubernetesVersion.parse(version).plain
    if cfg.source == "binaries":
        pins = cfg.release_sha256.get(plain, {})
        missing = [name for name in names if name not in pins]
        if missing:
            raise KubernetesOperationError(
                f"{host}: no SHA-256 pin for {', '.join(missing)} {plain}: set "
                f"kubernetes.release_sha256.{plain} in the inventory (from the release's own "
                "checksum files) before upgrading with source: binaries"
            )
        commands: list[str] = []
        for name in names:
            install = f"install -m 0755 {{file}} /usr/local/bin/{name}"
            commands += checked_download(name, binary_url(cfg, plain, name), pins[name], install)
        return " && ".join(commands)
    pins = " ".join(shlex.quote(f"{name}={plain}-{cfg.package_revision}") for name in names)
    return (
        f"apt-mark unhold {' '.join(names)} && DEBIAN_FRONTEND=noninteractive apt-get install "
        f"-y -q --no-install-recommends {pins} && apt-mark hold {' '.join(names)}"
    )


def target_cluster_configuration(loaded: LoadedCluster, target: str) -> str:
    """The ClusterConfiguration the role renders for the target version, as kubeadm stores it in
    kube-system/kubeadm-config. `kubeadm upgrade` writes the new static pod manifests from that
    ConfigMap, and flags that change between minors must change with them: 1.35's gang
    scheduling API (scheduling.k8s.io/v1alpha1) is gone in 1.36, whose API server would refuse
    to start when --runtime-config still named it."""
    versions = loaded.cluster.versions.model_copy(
        update={"kubernetes": KubernetesVersion.parse(target).plain}
    )
    cluster = loaded.cluster.model_copy(update={"versions": versions})
    moved = loaded.model_copy(update={"cluster": cluster})
    first = _first(loaded)
    ctx = next(c for c in host_contexts(moved) if c.name == first)
    return dump([cluster_configuration(ctx, ctx.config(KubernetesConfig))])


def store_cluster_configuration(loaded: LoadedCluster, target: str) -> str:
    """The command that puts target_cluster_configuration into kubeadm-config (kept on the node
    too, beside the role's kubeadm files, for the operator to read)."""
    document = target_cluster_configuration(loaded, target)
    patch = json.dumps({"data": {"ClusterConfiguration": document}})
    path = f"{CONFIG_DIR}/upgrade-{target}-cluster-configuration.json"
    encoded = base64.b64encode(patch.encode()).decode()
    return (
        f"echo {encoded} | base64 -d > {path} && {KUBECTL} -n kube-system patch configmap "
        f"kubeadm-config --type merge --patch-file {path}"
    )


# kubeadm's Corefile migration checks, ignored where the inventory pins CoreDNS (below).
COREDNS_CHECKS = ("CoreDNSUnsupportedPlugins", "CoreDNSMigration")


def pinned_coredns(loaded: LoadedCluster, first: str) -> str | None:
    """The CoreDNS tag the inventory pins (kubernetes.coredns_image_tag), which kubeadm must then
    leave alone. kubeadm would move CoreDNS to the version it was built with and migrate the
    Corefile, and its migration library refuses a version it does not know (kubeadm 1.36 on
    1.14.7: "start version '1.14.7' not supported"), in the preflight checks and in the addon
    phase both. The tag stays in the stored ClusterConfiguration, so the next apply keeps it."""
    return host_config(loaded, first, "kubernetes", KubernetesConfig).coredns_image_tag


def upgrade_flags(
    loaded: LoadedCluster, host: str, coredns: str | None, first: bool
) -> tuple[str, str]:
    """What kubeadm upgrade adds on a node: the preflight checks it ignores (those the
    inventory's kubernetes.ignore_preflight_errors names for the node, as at init and join, such
    as SystemVerification on cgroup v1 hosts; the Corefile checks on the first node where CoreDNS
    is pinned), and the phases it skips (addon/coredns on control-plane nodes then)."""
    cfg = host_config(loaded, host, "kubernetes", KubernetesConfig)
    ignored = list(cfg.ignore_preflight_errors)
    if coredns is not None and first:
        ignored += COREDNS_CHECKS
    checks = f" --ignore-preflight-errors={shlex.quote(','.join(ignored))}" if ignored else ""
    control_plane = "control_plane" in loaded.cluster.hosts[host].groups
    phases = " --skip-phases addon/coredns" if coredns is not None and control_plane else ""
    return checks, phases


@dataclass
class UpgradeRun(KubernetesRun):
    """One `kubernetes upgrade`: the plan its steps follow."""

    tag: str = ""
    coredns: str | None = None
    first: str = ""
    control_plane: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    budget_percent: float = 20.0
    stored: bool = False  # kubeadm-config holds the target's ClusterConfiguration
    applying: bool = False  # kubeadm upgrade apply started and has not finished
    applied: bool = False  # kubeadm upgrade apply finished: kubeadm-config is the target's now


def upgrade(
    loaded: LoadedCluster,
    target: str,
    budget_percent: float = 20.0,
    runner: RemoteRunner = run_remote,
    progress: Callable[[str], None] | None = None,
    *,
    skip: Iterable[str] = (),
    only: str | None = None,
) -> Outcome:
    """The steps of `day2.flows.KUBERNETES_UPGRADE`; the first command that fails stops it
    with its node and step named, the nodes after it untouched."""
    from day2.flows import KUBERNETES_UPGRADE

    current = loaded.cluster.versions.kubernetes
    check_upgrade_step(current, target)
    version = KubernetesVersion.parse(target)
    cluster = loaded.cluster
    first = _first(loaded)
    job = UpgradeRun(
        loaded,
        runner,
        Outcome(f"upgrade {current} -> {version.tag}"),
        tag=version.tag,
        coredns=pinned_coredns(loaded, first),
        first=first,
        control_plane=cluster.in_group("control_plane"),
        workers=cluster.in_group("gpu_worker") + cluster.in_group("cpu_worker"),
        budget_percent=budget_percent,
    )
    if only is None:
        check_runtimes(job, target)
    run_flow(
        KUBERNETES_UPGRADE,
        job,
        error=KubernetesOperationError,
        skip=skip,
        only=only,
        progress=progress,
    )
    notes = job.outcome.notes
    notes.append(
        f"set versions.kubernetes: {version.plain} in the inventory so apply keeps this version"
    )
    if job.coredns is not None:
        notes.append(f"CoreDNS stays at {job.coredns}, as kubernetes.coredns_image_tag pins it")
    return job.outcome


# kubeadm keeps no patches in the cluster: named again, the directory's kubelet patch is applied
# to the kubelet configuration the upgrade writes, on every node (a worker's reserved
# resources, eviction thresholds and max pods would otherwise revert to the cluster's).
_PATCHES = f"--patches {PATCHES_DIR}"
# Where the first control-plane node keeps kubeadm-config's ClusterConfiguration as it was
# before the upgrade rewrote it, to put it back when plan or apply fails.
SAVED_CONFIGURATION = f"{CONFIG_DIR}/upgrade-saved-cluster-configuration.yaml"
_NODE_STATE = (
    "-o jsonpath='{.status.nodeInfo.kubeletVersion} "
    '{.status.conditions[?(@.type=="Ready")].status}\''
)


def check_runtimes(job: UpgradeRun, target: str) -> None:
    """Refuse, before anything changes, a target whose kubelet needs a newer container runtime
    than a node runs (Kubernetes 1.36 and containerd 1.x): read from the nodes themselves."""
    needs = kubernetes_needs(target)
    if needs is None:
        return
    nodes = json.loads(
        job.command(job.first, "read the nodes' container runtimes", f"{KUBECTL} get nodes -o json")
    )
    behind = []
    for node in nodes.get("items", []):
        runtime = node.get("status", {}).get("nodeInfo", {}).get("containerRuntimeVersion", "")
        name, _, version = runtime.partition("://")
        have = release_key(version)
        if name == "containerd" and have is not None and have < release_key(needs.min_containerd):
            behind.append(f"{node['metadata']['name']} ({runtime})")
    if behind:
        raise KubernetesOperationError(
            f"upgrade to {job.tag} refused before any change: Kubernetes "
            f"{KubernetesVersion.parse(target).major_minor} needs containerd "
            f"{needs.min_containerd} or newer, and {', '.join(behind)} run older; upgrade "
            "their runtime first (versions.containerd, then apply)"
        )


def upgrade_first_control_plane(job: UpgradeRun) -> None:
    loaded, first, tag = job.loaded, job.first, job.tag
    job.command(first, "install kubeadm", package_commands(loaded, first, tag, ["kubeadm"]))
    job.command(
        first,
        "save kubeadm-config's ClusterConfiguration",
        f"{KUBECTL} -n kube-system get configmap kubeadm-config "
        f"-o jsonpath='{{.data.ClusterConfiguration}}' > {SAVED_CONFIGURATION}",
    )
    job.command(
        first,
        "store the target's ClusterConfiguration in kubeadm-config",
        store_cluster_configuration(loaded, tag),
    )
    job.stored = True
    checks, phases = upgrade_flags(loaded, first, job.coredns, first=True)
    job.command(first, "plan the upgrade", f"kubeadm upgrade plan {tag}{checks}")
    apply = f"kubeadm upgrade apply {tag} -y {_PATCHES}{checks}{phases}"
    job.applying = True
    job.command(first, "kubeadm upgrade apply", apply, 1800)
    job.applying, job.applied = False, True
    _upgrade_kubelet(job, first)


def restore_cluster_configuration() -> str:
    """The command that puts the saved ClusterConfiguration back into kubeadm-config."""
    program = (
        "import json, sys; "
        "print(json.dumps({'data': {'ClusterConfiguration': open(sys.argv[1]).read()}}))"
    )
    patch = f"{SAVED_CONFIGURATION}.json"
    return (
        f"python3 -c {shlex.quote(program)} {SAVED_CONFIGURATION} > {patch} && "
        f"{KUBECTL} -n kube-system patch configmap kubeadm-config --type merge --patch-file {patch}"
    )


def upgrade_left_first(job: UpgradeRun) -> str:
    """What a failed first step changed: kubeadm-config put back where only plan ran, said
    exactly where apply had started."""
    installed = f"kubeadm {job.tag} is installed on {job.first}; no other node was touched"
    if not job.stored:
        return installed
    if job.applied:
        return (
            f"kubeadm upgrade apply finished: {job.first}'s control plane runs {job.tag} and "
            f"kube-system/kubeadm-config holds its ClusterConfiguration; {job.first}'s kubelet "
            "is where it stopped (rerun the upgrade to go on); no other node was touched"
        )
    if job.applying:
        return (
            f"kube-system/kubeadm-config holds {job.tag}'s ClusterConfiguration (the previous one "
            f"is in {SAVED_CONFIGURATION} on {job.first}); kubeadm rolls its static pods back "
            f"when apply fails, so check which version {job.first}'s API server runs; {installed}"
        )
    ok, said = job.attempt(job.first, "put kubeadm-config back", restore_cluster_configuration())
    if ok:
        return f"kube-system/kubeadm-config was put back as it was; {installed}"
    return (
        f"kube-system/kubeadm-config still holds {job.tag}'s ClusterConfiguration and could not "
        f"be put back ({said}); the previous one is in {SAVED_CONFIGURATION} on {job.first}; "
        f"{installed}"
    )


def upgrade_control_plane(job: UpgradeRun) -> None:
    loaded, tag = job.loaded, job.tag
    for host in job.control_plane[1:]:
        job.command(host, "install kubeadm", package_commands(loaded, host, tag, ["kubeadm"]))
        flags = "".join(upgrade_flags(loaded, host, job.coredns, False))
        job.command(host, "kubeadm upgrade node", f"kubeadm upgrade node {_PATCHES}{flags}", 1800)
        _upgrade_kubelet(job, host)


def upgrade_left_control_plane(job: UpgradeRun) -> str:
    return (
        f"the first control-plane node runs {job.tag}, as do the control-plane nodes before the "
        "one named; those after it and every worker were not touched"
    )


def upgrade_workers(job: UpgradeRun) -> None:
    loaded, first, tag = job.loaded, job.first, job.tag
    workers = job.workers
    size = batch_size(len(workers), job.budget_percent)
    for start in range(0, len(workers), size):
        batch = workers[start : start + size]
        for host in batch:
            job.command(first, f"drain {host}", drain_command(host))
        for host in batch:
            job.command(host, "install kubeadm", package_commands(loaded, host, tag, ["kubeadm"]))
            flags = "".join(upgrade_flags(loaded, host, job.coredns, False))
            job.command(
                host, "kubeadm upgrade node", f"kubeadm upgrade node {_PATCHES}{flags}", 1800
            )
            _upgrade_kubelet(job, host)
        for host in batch:
            job.command(first, f"uncordon {host}", f"{KUBECTL} uncordon {shlex.quote(host)}")


def upgrade_left_workers(job: UpgradeRun) -> str:
    return (
        f"the control plane runs {job.tag}, so do the workers of earlier batches; this batch's "
        "drained workers stay cordoned (`kubectl uncordon` them once they are fixed), later "
        "batches were not touched"
    )


def _upgrade_kubelet(job: UpgradeRun, host: str) -> None:
    """The new kubelet and kubectl, then kubelet restarted. On a control-plane node the static
    pods are stopped first and started after: the new kubelet names a static pod by a hash its
    own version computes, so it took 1.35's running API server for an orphan, killed it without
    its shutdown delay and started 1.36's at once, and the balancers sent requests to a server
    that had not loaded its RBAC rules yet (Forbidden) or was going away (EOF), seen on the lab
    on 2026-11-29."""

    def install_and_restart() -> None:
        job.command(
            host,
            "upgrade kubelet and kubectl",
            package_commands(job.loaded, host, job.tag, ["kubelet", "kubectl"]),
        )
        job.command(host, "restart kubelet", "systemctl daemon-reload && systemctl restart kubelet")

    if host in job.control_plane:
        restart_control_plane(job, host, install_and_restart)
    else:
        install_and_restart()
    _wait_ready(job, host)


def _wait_ready(job: UpgradeRun, host: str, seconds: int = 300) -> None:
    """The node Ready at the new kubelet version before anything else happens to it or to the
    next node (uncordon, the next batch); otherwise the upgrade stops, saying what it reports."""
    query = f"{KUBECTL} get node {shlex.quote(host)} {_NODE_STATE}"
    wanted = shlex.quote(f"{job.tag} True")
    ok, _ = job.attempt(
        job.first,
        f"wait for {host} Ready at {job.tag}",
        _wait(f'test "$({query})" = {wanted}', seconds),
    )
    if not ok:
        _, seen = job.attempt(job.first, f"read {host}'s state", query)
        raise KubernetesOperationError(
            f"{host}: not Ready at {job.tag} within {seconds} s of its kubelet's restart "
            f"(it reports: {seen.strip() or 'nothing'})"
        )


def drain_command(node: str, force: bool = False) -> str:
    """kubectl drain; `force` also deletes pods that no controller manages (they are lost)."""
    return (
        f"{KUBECTL} drain {shlex.quote(node)} --ignore-daemonsets --delete-emptydir-data "
        f"--timeout=600s{' --force' if force else ''}"
    )


# ---------------------------------------------------------------- nodes


@dataclass
class RemoveRun(KubernetesRun):
    """One `kubernetes node remove`: the node, and what the read step found about it."""

    node: str = ""
    first: str = ""
    force: bool = False
    found: bool = False  # the Node object is in the cluster
    was_cordoned: bool = False


def remove_node(
    loaded: LoadedCluster,
    node: str,
    force: bool = False,
    runner: RemoteRunner = run_remote,
    *,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """The steps of `day2.flows.KUBERNETES_NODE_REMOVE`: cordon, drain, delete the Node object
    (on the first control-plane node), then `kubeadm reset` on the node itself. The first
    control-plane node is never removed here. A drain that fails (a pod no controller manages,
    without `force`; a disruption budget) uncordons the node again if it was schedulable
    before, so nothing is left half done. A Node an earlier run deleted is only reset."""
    from day2.flows import KUBERNETES_NODE_REMOVE

    cluster = loaded.cluster
    if node not in cluster.hosts:
        raise KubernetesOperationError(f"{loaded.source}: no host {node!r} in the inventory")
    first = _first(loaded)
    if node == first:
        raise KubernetesOperationError(
            f"{node} is the first control-plane node (it hands out joins): move another "
            "control-plane node first in the inventory before removing it"
        )
    job = RemoveRun(
        loaded, runner, Outcome(f"node remove {node}"), node=node, first=first, force=force
    )
    run_flow(
        KUBERNETES_NODE_REMOVE,
        job,
        error=KubernetesOperationError,
        skip=skip,
        only=only,
        progress=progress,
    )
    if job.found and only is None:
        job.outcome.notes.append(f"remove {node} from the inventory so apply does not join it")
    return job.outcome


def remove_read(job: RemoveRun) -> None:
    found = job.command(
        job.first,
        f"read {job.node}",
        f"{KUBECTL} get node {shlex.quote(job.node)} --ignore-not-found "
        "-o jsonpath='{.metadata.name} {.spec.unschedulable}'",
    ).split()
    job.found, job.was_cordoned = bool(found), found[1:] == ["true"]
    if not found:  # deleted by an earlier run that stopped before the reset: finish it
        job.outcome.notes.append(f"{job.node} was no longer in the cluster: reset only")


def remove_deleted_already(job: RemoveRun) -> bool:
    return not job.found


def remove_cordon(job: RemoveRun) -> None:
    job.command(job.first, f"cordon {job.node}", f"{KUBECTL} cordon {shlex.quote(job.node)}")


def remove_drain(job: RemoveRun) -> None:
    job.command(job.first, f"drain {job.node}", drain_command(job.node, job.force))


def remove_left_drain(job: RemoveRun) -> str:
    """A node that was schedulable before is uncordoned again: a failed drain changes nothing."""
    if job.was_cordoned:
        return f"{job.node} is in the cluster, cordoned as it was before"
    ok, said = job.attempt(
        job.first, f"uncordon {job.node}", f"{KUBECTL} uncordon {shlex.quote(job.node)}", 60
    )
    left = "schedulable again" if ok else f"still cordoned (uncordon failed: {said})"
    return f"{job.node} is in the cluster, {left}"


def remove_delete(job: RemoveRun) -> None:
    job.command(
        job.first, f"delete node {job.node}", f"{KUBECTL} delete node {shlex.quote(job.node)}"
    )


def remove_left_drained(job: RemoveRun) -> str:
    return f"{job.node} is drained and cordoned, still in the cluster; {_REMOVE_AGAIN}"


def remove_reset(job: RemoveRun) -> None:
    job.command(job.node, "kubeadm reset", "kubeadm reset -f")


def remove_left_deleted(job: RemoveRun) -> str:
    return f"the Node object is deleted, the host not reset; {_REMOVE_AGAIN} (it resets only)"


_REMOVE_AGAIN = "run `gpuinfra kubernetes node remove` again to finish"


@dataclass
class AddRun:
    """One `kubernetes node add`: the hosts the kubernetes role runs on, and its run's report."""

    loaded: LoadedCluster
    limit: tuple[str, ...]
    report: RunReport | None = None


def add_nodes(
    loaded: LoadedCluster,
    nodes: list[str],
    *,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunReport:
    """The step of `day2.flows.KUBERNETES_NODE_ADD`: join new nodes, running the kubernetes
    role on them and on the first control-plane node (which hands out the short-lived token),
    rate-limited like any join."""
    from day2.flows import KUBERNETES_NODE_ADD

    unknown = [n for n in nodes if n not in loaded.cluster.hosts]
    if unknown:
        raise KubernetesOperationError(f"{loaded.source}: no host {', '.join(unknown)}")
    job = AddRun(loaded, (_first(loaded), *nodes))
    run_flow(
        KUBERNETES_NODE_ADD,
        job,
        error=KubernetesOperationError,
        skip=skip,
        only=only,
        progress=progress,
    )
    return job.report  # type: ignore[return-value]  # the join step, never skipped, set it


def add_join(job: AddRun) -> None:
    job.report = run(
        job.loaded, RunOptions(mode=Mode.apply, limit=job.limit, roles=("kubernetes",))
    )
