"""pyinfra operations of the kubernetes role: packages, kubeadm init, the joins, Calico and the
operator's kubeconfig.

Each operation decides inside itself what its node needs (first control-plane node or not,
joined or not), so every node of a phase runs the same sequence of operations, as pyinfra
requires. Join tokens and certificate keys exist only inside the join step: they are read from
the first control-plane node over its own connection, never put on a command line, never
logged, and reach the joining node only in a copy of its join file in a 0700 directory that is
removed after the join.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass
from io import BytesIO, StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha1File

from inventory.versions import KubernetesVersion
from roles.kubernetes import models as m
from roles.kubernetes.cni import ROUTE_REFLECTOR_ANNOTATION, CalicoScale
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.facts import (
    ApiAnswers,
    FileExists,
    KubeBinaries,
    LiveObjectsDiffer,
)
from roles.kubernetes.kubeadm import ADMIN_CONF, INIT_CONFIG, KUBELET_CONF, SECRET_DIR
from roles.kubernetes.stages import FIELD_MANAGER, ApplyStage
from toolkit import record
from toolkit.aptkeys import KeyFingerprints, fetch_key_commands
from toolkit.clock import wall_seconds
from toolkit.facts import HeldPackages
from toolkit.operations import report_note, wait_for
from toolkit.pacing import JOIN_PACER, Pacer, Rate, SlotPacer, shared_pacer

PACKAGES = ("kubeadm", "kubelet", "kubectl")
# An API server that pushes back: HTTP 429 or a 5xx in kubeadm's error output.
_THROTTLED = re.compile(r"\b(429|50[0-4])\b|Too Many Requests|Service Unavailable", re.I)
_JOIN_COMMAND = re.compile(r"--token\s+(\S+).*--discovery-token-ca-cert-hash\s+(sha256:[0-9a-f]+)")
_CERT_KEY = re.compile(r"^([0-9a-f]{64})\s*$", re.M)
HEALTHZ = f"kubectl --kubeconfig {ADMIN_CONF} --request-timeout=5s get --raw /healthz"
JOIN_ATTEMPTS = 4
# kubeadm's preflight changes nothing on the node, and some of its checks ask the cluster (the
# images pulled through the registry, the external etcd's version): one that failed is tried
# again after a pause, as Kubespray retries its joins; a check that keeps failing fails the
# join after JOIN_ATTEMPTS, naming it.
_PREFLIGHT_FAILED = re.compile(r"error execution phase preflight")
PREFLIGHT_RETRY_S = 15.0
# Making a join token or certificate key on the first control-plane node: tries, and the pause
# between them (the API can be briefly unavailable while control-plane nodes join).
SECRET_ATTEMPTS = 5
SECRET_RETRY_S = 6.0


class JoinFailed(RuntimeError):
    """A join could not get its secrets or failed; the message never holds a secret."""


# ---------------------------------------------------------------- packages


@operation()
def disabled(reason: str = "kubernetes disabled (kubernetes.enabled: false)"):
    """Nothing to do here, and the report says why."""
    report_note(f"{reason}: nothing written or run")
    return
    yield  # an operation is a generator


def package_pins(cfg: KubernetesConfig, version: str) -> dict[str, str]:
    """Package -> the exact Debian version to install (pkgs.k8s.io's "<version>-<revision>")."""
    return {name: f"{version}-{cfg.package_revision}" for name in PACKAGES}


def missing_repository_message(version: str, repo: str) -> str:
    return (
        f"kubernetes: kubeadm {version} is not in any apt source of this host ({repo} not "
        "reachable?): set kubernetes.source to mirror, binaries or preinstalled"
    )


@operation()
def kubernetes_installed(cfg: KubernetesConfig, version: str, repo: str):
    """kubeadm, kubelet and kubectl at the pinned version, held, with cri-tools and the CNI
    plugins; from the package repository of that minor (or a mirror of it), the release
    binaries checked against their SHA-256 pins, or a host image that holds them already."""
    if cfg.source == "preinstalled":
        found = host.get_fact(KubeBinaries) or {}
        wrong = {
            name: found.get(name, "missing")
            for name in PACKAGES
            if found.get(name, "").lstrip("v") != version
        }
        if wrong:
            detail = ", ".join(f"{name} {have}" for name, have in sorted(wrong.items()))
            raise OperationError(
                f"kubernetes: source preinstalled needs kubeadm, kubelet and kubectl v{version} "
                f"on the host ({detail})"
            )
        host.noop(f"kubeadm, kubelet and kubectl v{version} preinstalled")
        return
    if cfg.source == "binaries":
        yield from _binary_commands(cfg, version)
        return
    pins = package_pins(cfg, version)
    installed = host.get_fact(DebPackages) or {}
    held = set(host.get_fact(HeldPackages) or [])
    current = all(pin in installed.get(name, []) for name, pin in pins.items())
    wanted = [*PACKAGES, "cri-tools", "kubernetes-cni"]
    if current and held.issuperset(PACKAGES):
        host.noop(f"kubeadm, kubelet and kubectl {version} installed and held")
        return
    message = shlex.quote(missing_repository_message(version, repo))
    listed = shlex.quote(f" {pins['kubeadm']} ")
    yield (
        f"apt-cache madison kubeadm 2>/dev/null | grep -qF {listed} || "
        f"{{ echo {message} >&2; exit 1; }}"
    )
    specs = " ".join(shlex.quote(f"{name}={pin}") for name, pin in pins.items())
    yield (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        f"--allow-change-held-packages {specs} cri-tools kubernetes-cni"
    )
    yield f"apt-mark hold {' '.join(wanted)}"


def _binary_commands(cfg: KubernetesConfig, version: str):
    """Release binaries and tarballs, each checked against its SHA-256 before it is used."""
    found = host.get_fact(KubeBinaries) or {}
    downloads = []
    for name in PACKAGES:
        if found.get(name, "").lstrip("v") != version:
            url = binary_url(cfg, version, name)
            downloads.append((name, url, f"install -m 0755 {{file}} /usr/local/bin/{name}"))
    if not host.get_fact(FileExists, path=f"/opt/cni/bin/.gpuinfra-v{cfg.cni_plugins_version}"):
        tag = f"v{cfg.cni_plugins_version}"
        url = f"{cfg.cni_plugins_url.rstrip('/')}/{tag}/cni-plugins-linux-amd64-{tag}.tgz"
        unpack = (
            "mkdir -p /opt/cni/bin && tar -xzf {file} -C /opt/cni/bin && "
            f"touch {shlex.quote(f'/opt/cni/bin/.gpuinfra-{tag}')}"
        )
        downloads.append(("cni-plugins", url, unpack))
    crictl = cfg.cri_tools_version
    if crictl is not None and not host.get_fact(
        FileExists, path=f"/usr/local/bin/.crictl-v{crictl}"
    ):
        tag = f"v{crictl}"
        url = f"{cfg.cri_tools_url.rstrip('/')}/{tag}/crictl-{tag}-linux-amd64.tar.gz"
        marker = shlex.quote(f"/usr/local/bin/.crictl-{tag}")
        unpack = f"tar -xzf {{file}} -C /usr/local/bin crictl && touch {marker}"
        downloads.append(("crictl", url, unpack))
    for name, url, install in downloads:
        yield from checked_download(name, url, cfg.binary_sha256[name], install)


def binary_url(cfg: KubernetesConfig, version: str, name: str) -> str:
    """Where a release keeps one of kubeadm, kubelet and kubectl (dl.k8s.io's layout)."""
    return f"{cfg.binaries_url}/{KubernetesVersion.parse(version).tag}/bin/linux/amd64/{name}"


def checked_download(name: str, url: str, sha256: str, install: str) -> list[str]:
    """Download to a staging file, check it against its SHA-256 pin, then `install` it
    ({file} is the staged file): a file that does not match is removed, never used."""
    staged = f"/var/tmp/gpuinfra-{name}-download"
    return [
        f"curl -fsSL --retry 3 -o {staged} {shlex.quote(url)}",
        f"echo '{sha256}  {staged}' | sha256sum -c --quiet - || "
        f"{{ rm -f {staged}; echo 'kubernetes: {name} SHA-256 mismatch' >&2; exit 1; }}",
        f"{install.format(file=staged)} && rm -f {staged}",
    ]


@operation()
def repository_key(enabled: bool, url: str, fingerprint: str, dest: str):
    """The Kubernetes repository's key, pinned by fingerprint (container_runtime's key
    commands); a host that cannot fetch it stops with one line saying what to do instead."""
    if not enabled:
        return
    if fingerprint.upper() in (host.get_fact(KeyFingerprints, path=dest) or []):
        host.noop("the Kubernetes repository key is in place")
        return
    message = shlex.quote(
        f"kubernetes: cannot fetch the Kubernetes package key from {url}: set "
        "kubernetes.source to mirror, binaries or preinstalled"
    )
    for command in fetch_key_commands(url, fingerprint, dest):
        if command.startswith("curl "):
            command = f"{command} 2>/dev/null || {{ echo {message} >&2; exit 1; }}"
        yield command


# ---------------------------------------------------------------- init


@operation()
def control_plane_initialised(first: bool, config: str, timeout_s: int):
    """`kubeadm init --upload-certs` on the first control-plane node, once: skipped when
    admin.conf exists and the API answers /healthz (a node with admin.conf whose API is slow to
    answer is waited for, never initialised again). Tokens and the certificate key are not
    printed; the init's own token lives 15 minutes (the init file's bootstrapTokens)."""
    if not first:
        host.noop("not the first control-plane node")
        return
    api = host.get_fact(ApiAnswers, kubeconfig=ADMIN_CONF)
    if api["kubeconfig"] and api["healthy"]:
        host.noop("initialised: the API answers /healthz")
        return
    if api["kubeconfig"]:
        yield wait_for(HEALTHZ, timeout_s)
        return
    quoted = shlex.quote(config)
    yield f"kubeadm config validate --config {quoted}"
    yield (
        f"kubeadm init --config {quoted} --upload-certs --skip-token-print "
        "--skip-certificate-key-print"
    )
    yield wait_for(HEALTHZ, timeout_s)


@operation()
def calico_applied(
    first: bool, cfg: KubernetesConfig, scale: CalicoScale, resources: list[str], marker: str
):
    """The upstream manifest of the pinned version (calico.yaml, or calico-typha.yaml past 50
    nodes; checked against its SHA-256, IP-in-IP turned off before it is applied), Typha scaled
    to the fleet, then this role's pool, BGP and config objects. Never an unpinned download:
    without `calico_manifest_sha256` nothing is applied and the run says so."""
    if not first:
        host.noop("not the first control-plane node")
        return
    if cfg.cni != "calico":
        host.noop(f"the pod network is {cfg.cni!r}, not Calico")
        return
    if cfg.calico_manifest_sha256 is None:
        report_note(
            f"Calico {cfg.calico_version} not applied: set kubernetes.calico_manifest_sha256 "
            f"to the SHA-256 of its {scale.manifest} (nodes stay NotReady without a CNI)"
        )
        return
    pinned = f"{cfg.calico_manifest_sha256}{scale.manifest}{scale.typha_replicas}"
    digest = hashlib.sha256((pinned + "".join(resources)).encode()).hexdigest()
    if host.get_fact(FileExists, path=f"{marker}.{digest}"):
        host.noop(f"Calico {cfg.calico_version} applied")
        return
    url = (
        "https://raw.githubusercontent.com/projectcalico/calico/"
        f"{cfg.calico_version}/manifests/{scale.manifest}"
    )
    staged = f"/var/tmp/calico-{cfg.calico_version}-{scale.manifest}"
    yield f"curl -fsSL --retry 3 -o {staged} {shlex.quote(url)}"
    yield (
        f"echo '{cfg.calico_manifest_sha256}  {staged}' | sha256sum -c --quiet - || "
        f"{{ rm -f {staged}; echo 'kubernetes: {scale.manifest} SHA-256 mismatch' >&2; exit 1; }}"
    )
    # calico-node creates its first pool from these variables: no IP-in-IP, no VXLAN.
    yield (
        f'sed -i \'/CALICO_IPV4POOL_IPIP/{{n;s/"Always"/"Never"/}}\' {staged} && '
        f"kubectl --kubeconfig {ADMIN_CONF} apply -f {staged}"
    )
    if scale.typha_replicas:
        yield (
            f"kubectl --kubeconfig {ADMIN_CONF} -n kube-system scale deployment calico-typha "
            f"--replicas={scale.typha_replicas}"
        )
    for path in resources:
        yield f"kubectl --kubeconfig {ADMIN_CONF} apply -f {shlex.quote(path)}"
    yield f"rm -f {marker}.* && touch {marker}.{digest}"


@operation()
def route_reflector_annotated(node: str, cluster_id: str, marker: str):
    """This control-plane node reflects Calico's routes: its Node carries Calico's cluster ID
    annotation (the label the BGPPeer selects comes with kubelet's --node-labels). Once per
    cluster ID, as the Calico step is applied once (a marker file)."""
    if host.get_fact(FileExists, path=f"{marker}.{cluster_id}"):
        host.noop(f"{node} reflects routes (cluster ID {cluster_id})")
        return
    yield (
        f"kubectl --kubeconfig {ADMIN_CONF} annotate node {shlex.quote(node)} "
        f"{ROUTE_REFLECTOR_ANNOTATION}={cluster_id} --overwrite"
    )
    yield f"rm -f {marker}.* && touch {marker}.{cluster_id}"


# ---------------------------------------------------------------- cluster objects

KUBECTL = f"kubectl --kubeconfig {ADMIN_CONF}"
SERVER_SIDE_APPLY = (
    f"{KUBECTL} apply --server-side --field-manager={FIELD_MANAGER} --force-conflicts"
)


def apply_commands(stages: list[ApplyStage], timeout_s: int) -> list[str]:
    """One server-side apply per stage, in order; after the CRDs, a wait until the API serves
    them (a custom resource in a later stage is refused before that)."""
    commands = []
    for stage in stages:
        quoted = shlex.quote(stage.path)
        commands.append(f"{SERVER_SIDE_APPLY} -f {quoted}")
        if stage.crds:
            commands.append(
                f"{KUBECTL} wait --for condition=established --timeout={timeout_s}s -f {quoted}"
            )
    return commands


@operation()
def cluster_objects_applied(first: bool, stages: list[ApplyStage], timeout_s: int):
    """Every role's Kubernetes objects (_cluster/kubernetes/, placed in apply stages), applied
    server-side from the first control-plane node when `kubectl diff --server-side` of the
    placed files finds a live object that differs (changed, edited or deleted by hand), or the
    API cannot be asked (not initialised yet, or a kind it does not serve yet).

    pyinfra runs this body twice: for the plan, before the files are written (so a placed file
    that is about to change counts as a change: its diff against the live objects is not known
    yet), and again when it executes, after the files were written, when the diff is exact."""
    if not first:
        host.noop("not the first control-plane node")
        return
    if not stages:
        host.noop("no cluster objects to apply")
        return
    changing = [
        stage.path
        for stage in stages
        if host.get_fact(Sha1File, path=stage.path)
        != hashlib.sha1(stage.content.encode()).hexdigest()
    ]
    if not changing and host.get_fact(ApiAnswers, kubeconfig=ADMIN_CONF)["healthy"]:
        live = host.get_fact(
            LiveObjectsDiffer,
            kubeconfig=ADMIN_CONF,
            paths=tuple(stage.path for stage in stages),
            field_manager=FIELD_MANAGER,
        )
        if live["status"] == "same":
            host.noop("the cluster's objects are applied: the live objects match the files")
            return
        for difference in live["differences"]:
            report_note(f"live object differs from the files: {difference}")
    yield from apply_commands(stages, timeout_s)


# ---------------------------------------------------------------- join secrets


@dataclass
class JoinSecrets:
    token: str
    ca_cert_hash: str
    certificate_key: str | None = None


_secrets_lock = threading.Lock()  # a greenlet lock under gevent's monkey patching


def _run_on_first(state, first_name: str, command: str, what: str) -> str:
    first = state.inventory.get_host(first_name)
    if first is None or first not in state.active_hosts:
        raise JoinFailed(
            f"{first_name} (the first control-plane node) failed or is not in this run: it "
            f"hands out the {what}; include it (--limit) and fix it first"
        )
    detail = ""
    for attempt in range(SECRET_ATTEMPTS):
        if attempt:
            time.sleep(SECRET_RETRY_S)  # an API server restarting, or the balancer catching up
        ok, output = first.run_shell_command(
            StringCommand(command), print_output=False, print_input=False, _timeout=120
        )
        if ok:
            return output.stdout
        detail = " | ".join(line.line for line in output if line.line.strip())[-300:]
    # What kubeadm said (never a secret: a failed create prints none) names the cause.
    raise JoinFailed(f"{first_name} could not create the {what}: {redact(detail, None)}")


# In a rollout Job's pod: the path of the mounted Secret `gpuinfra-rollout-join`, holding the
# token the controller minted on cp-1 (`{"token": ..., "ca_cert_hash": ...}`); the pod cannot
# reach cp-1's kubeadm, and gets no certificate key (workers only).
JOIN_SECRETS_ENV = "GPUINFRA_JOIN_SECRETS"


def preset_join_secrets() -> JoinSecrets | None:
    """The token handed to a rollout pod (JOIN_SECRETS_ENV), or None outside one."""
    path = os.environ.get(JOIN_SECRETS_ENV)
    if not path:
        return None
    try:
        found = json.loads(Path(path).read_text())
        return JoinSecrets(str(found["token"]), str(found["ca_cert_hash"]))
    except (OSError, ValueError, KeyError) as exc:
        # The file's name and the kind of fault, never its content.
        raise JoinFailed(f"{JOIN_SECRETS_ENV}={path}: unreadable ({type(exc).__name__})") from None


def join_secrets(state, first_name: str, control_plane: bool, token_ttl: str) -> JoinSecrets:
    """One short-lived token (and, for control-plane joins, one fresh certificate key) per run,
    made on the first control-plane node when the first node of the run needs it; in a rollout
    pod, the token the controller made (workers only)."""
    preset = preset_join_secrets()
    if preset is not None:
        if control_plane:
            raise JoinFailed("a rollout Job joins workers only: no control-plane join here")
        return preset
    with _secrets_lock:
        secrets: JoinSecrets | None = getattr(state, "_gpuinfra_kube_join", None)
        if secrets is None:
            printed = _run_on_first(
                state,
                first_name,
                # The admin kubeconfig named: left to itself, kubeadm 1.35 once looked for
                # /root/.kube/config on cp-1 and failed every try.
                f"kubeadm token create --kubeconfig {ADMIN_CONF} --ttl {shlex.quote(token_ttl)} "
                "--print-join-command",
                "join token",
            )
            match = _JOIN_COMMAND.search(printed)
            if not match:
                raise JoinFailed(f"{first_name}: no token in kubeadm's join command")
            secrets = JoinSecrets(match[1], match[2])
            state._gpuinfra_kube_join = secrets
        if control_plane and secrets.certificate_key is None:
            # Uploads the control-plane certificates again under a new key (kept 2 hours by
            # kubeadm): a key from an earlier run is never reused.
            printed = _run_on_first(
                state,
                first_name,
                # With the init file: kubeadm's defaults know no external etcd, and a
                # joining control-plane node then finds no etcd client certificate to fetch.
                f"kubeadm init phase upload-certs --upload-certs --config {INIT_CONFIG}",
                "certificate key",
            )
            match = _CERT_KEY.search(printed)
            if not match:
                raise JoinFailed(f"{first_name}: no certificate key in kubeadm's output")
            secrets.certificate_key = match[1]
        return secrets


def fill_join_config(content: str, secrets: JoinSecrets) -> str:
    text = content.replace(m.TOKEN_PLACEHOLDER, secrets.token).replace(
        m.CA_HASH_PLACEHOLDER, secrets.ca_cert_hash
    )
    if m.CERT_KEY_PLACEHOLDER in text:
        if secrets.certificate_key is None:
            raise JoinFailed("a control-plane join needs a certificate key")
        text = text.replace(m.CERT_KEY_PLACEHOLDER, secrets.certificate_key)
    return text


def redact(text: str, secrets: JoinSecrets | None) -> str:
    """Output for a report: the run's secrets and anything shaped like a token removed."""
    if secrets is not None:
        for value in (secrets.token, secrets.certificate_key):
            if value:
                text = text.replace(value, "<redacted>")
    text = re.sub(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b", "<redacted token>", text)
    return re.sub(r"\b[0-9a-f]{64}\b", "<redacted>", text)


def _record_check(target, check: dict) -> None:
    """A check in the run's own record of the host: the report shows it, and its detail is the
    host's error when the join failed (the runner keeps nothing on pyinfra's objects)."""
    record.host(target.name).checks.append(check)


# The report's check for each worker's join slot (its wall-clock `at` and the wait).
JOIN_SLOT_CHECK = "kubeadm join slot"


def _join_slot(host, pacer: Pacer | SlotPacer) -> None:
    """Wait for a slot right before the join itself, the upload done, so the API sees joins at
    the rate whatever each host's copy took; the report tells when the slot came (wall clock,
    the one the nodes share with the controller) and how long the host waited for it."""
    waited = pacer.acquire()
    _record_check(
        host,
        {
            "check": JOIN_SLOT_CHECK,
            "status": "ok",
            "detail": f"a join slot after {waited:.1f} s (rate {pacer.rate})",
            "at": wall_seconds(),
        },
    )


def run_join(
    state,
    host,
    first_name: str,
    content: str,
    control_plane: bool,
    token_ttl: str,
    pacer_rate: str | None,
) -> bool:
    """Fill the join file into a 0700 directory, validate it, join, remove it. Workers take a
    slot of the run's shared pacer before the join, and slow it down when the API pushes back."""
    pacer: Pacer | SlotPacer | None = (
        shared_pacer(JOIN_PACER, Rate.parse(pacer_rate)) if pacer_rate else None
    )
    secrets: JoinSecrets | None = None
    path = f"{SECRET_DIR}/kubeadm-join.yaml"
    detail = ""
    try:
        secrets = join_secrets(state, first_name, control_plane, token_ttl)
        text = fill_join_config(content, secrets)
        for _attempt in range(JOIN_ATTEMPTS):
            host.run_shell_command(
                StringCommand(f"install -d -m 0700 {SECRET_DIR} && umask 077 && : > {path}"),
                print_output=False,
                print_input=False,
            )
            host.put_file(StringIO(text), path, print_output=False, print_input=False)
            if pacer is not None:
                _join_slot(host, pacer)
            ok, output = host.run_shell_command(
                StringCommand(
                    f"chmod 0600 {path} && kubeadm config validate --config {path} && "
                    f"kubeadm join --config {path}; rc=$?; rm -f {path}; exit $rc"
                ),
                print_output=False,
                print_input=False,
                _timeout=900,
            )
            if ok:
                if pacer is not None:
                    pacer.recover()
                return True
            detail = "\n".join(line.line for line in output)
            if pacer is not None and _THROTTLED.search(detail):
                pacer.slow_down()  # the API answered 429/5xx: wider spacing for every worker
            elif _PREFLIGHT_FAILED.search(detail):
                time.sleep(PREFLIGHT_RETRY_S)
            else:
                break
    except JoinFailed as exc:
        detail = str(exc)
    _record_check(
        host,
        {
            "check": "kubeadm join",
            "status": "fail",
            "detail": f"kubeadm join: {join_failure(redact(detail, secrets))}",
        },
    )
    return False


def join_failure(output: str) -> str:
    """What a failed `kubeadm join` said, on one line: each failed preflight check (kubeadm's
    `[ERROR Name]: why` lines, which come before its closing lines), then its last lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    checks = [line for line in lines if line.startswith("[ERROR")]
    return " | ".join([*checks, *[line for line in lines[-3:] if line not in checks]])


@operation()
def control_plane_joined(
    first_name: str, content: str, token_ttl: str, timeout_s: int, wait_ready: bool
):
    """Join a further control-plane node (run with `_serial=True`: one node at a time), then
    wait for its API server to answer /healthz and, with a CNI applied, for it to be Ready,
    before the next node starts."""
    if host.name == first_name:
        host.noop("the first control-plane node is initialised, not joined")
        return
    if host.get_fact(FileExists, path=KUBELET_CONF):
        host.noop(f"joined: {KUBELET_CONF} exists")
        return
    yield FunctionCommand(run_join, (first_name, content, True, token_ttl, None), {})
    yield wait_for(HEALTHZ, timeout_s)
    if wait_ready:
        ready = (
            f"kubectl --kubeconfig {ADMIN_CONF} get node {shlex.quote(host.name)} -o "
            "jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
        )
        yield wait_for(ready, timeout_s)


@operation()
def worker_joined(first_name: str, content: str, token_ttl: str, rate: str):
    """Join a worker, paced by the run's shared rate limit; a joined node never waits."""
    if host.get_fact(FileExists, path=KUBELET_CONF):
        host.noop(f"joined: {KUBELET_CONF} exists")
        return
    yield FunctionCommand(run_join, (first_name, content, False, token_ttl, rate), {})


# ---------------------------------------------------------------- operator kubeconfig


def write_private(path: Path, data: bytes) -> None:
    """Write a secret file that is 0600 from its creation (never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    staged = path.with_name(f".{path.name}.new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(staged, path)


def _fetch_kubeconfig(state, host, local: str, server: str | None) -> bool:
    buffer = BytesIO()
    if not host.get_file(ADMIN_CONF, buffer, print_output=False, print_input=False):
        return False
    data = buffer.getvalue()
    target = Path(local)
    if server is not None:
        text = re.sub(r"(?m)^(\s*server:\s*).*$", lambda m: m[1] + server, data.decode())
        write_private(target, text.encode())
    else:
        write_private(target, data)
    # What the node holds, so the next run knows the copy is current even when rewritten.
    write_private(target.with_name(target.name + ".sha1"), hashlib.sha1(data).hexdigest().encode())
    return True


@operation()
def operator_kubeconfig(first: bool, local: str, server: str | None = None):
    """admin.conf from the first control-plane node into the controller's state (0600); with
    `server`, pointing at that address instead of the node-local proxy."""
    if not first:
        host.noop("not the first control-plane node")
        return
    remote = host.get_fact(Sha1File, path=ADMIN_CONF)
    target = Path(local)
    recorded = target.with_name(target.name + ".sha1")
    if remote and target.exists() and recorded.exists() and recorded.read_text() == remote:
        host.noop(f"{local} is up to date")
        return
    yield FunctionCommand(_fetch_kubeconfig, (local, server), {})
