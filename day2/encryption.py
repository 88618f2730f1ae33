"""`gpuinfra kubernetes rotate-secrets-key`: a new key for the Secrets the API servers encrypt
at rest (roles/kubernetes/encryption.py), in the order upstream documents for more than one
API server, so that no server ever meets a Secret it cannot read:

1. new-key: make the next key, kept beside the first in the cluster's state (0600);
2. add: every API server's file lists the old key first, the new one second (all can read
   what any will write), and each has loaded it;
3. switch: the new key first (it encrypts), the old one second (still read);
4. rewrite: every Secret written again, so it is encrypted with the new key; then etcd is
   read on an etcd member: no Secret may still be under the old key's name;
5. drop: the new key alone, loaded everywhere; it replaces the old one in the state.

An API server reloads the file on its own (--encryption-provider-config-automatic-reload); a
step waits until each one's /metrics reports the sha256 of the file it was given
(`apiserver_encryption_config_controller_last_config_info`), not for a fixed time. The file
goes to each node on ssh's stdin, never on a command line. Every step is safe to run again: a
rotation that stopped is finished by running the command again, and an apply refuses to run
until it is (encryption.rotation_findings).
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from day2.kubernetes import (
    KUBECTL,
    KubernetesOperationError,
    KubernetesRun,
    Outcome,
    _first,
    _wait,
)
from day2.steps import run_flow
from inventory.model import LoadedCluster
from roles.etcd.files import ETCDCTL_ENV
from roles.kubernetes import encryption
from toolkit.remote import RemoteRunner, run_remote
from toolkit.statefiles import kept_secret, state_lock

# Each API server's own, not the balanced endpoint: every one must have loaded the file.
LOCAL_METRICS = f"{KUBECTL} --server https://127.0.0.1:6443 get --raw /metrics"
LOADED_METRIC = "apiserver_encryption_config_controller_last_config_info"
# The API server looks at the file when it changes and at least once a minute.
RELOAD_WAIT_S = 150
SECRETS_PREFIX = "/registry/secrets/"


@dataclass
class RotateRun(KubernetesRun):
    """One rotation: the kept key, the next one, and the nodes given each file so far."""

    current: str = ""
    next: str = ""
    written: list[str] = field(default_factory=list)


def rotate_key(
    loaded: LoadedCluster,
    runner: RemoteRunner = run_remote,
    *,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """The steps of `day2.flows.KUBERNETES_ROTATE_SECRETS_KEY`."""
    from day2.flows import KUBERNETES_ROTATE_SECRETS_KEY

    job = RotateRun(loaded, runner, Outcome("rotate-secrets-key"))
    cfg_state = loaded.state_dir / encryption.KEY_STATE
    if not cfg_state.is_file():
        raise KubernetesOperationError(
            f"{loaded.source}: no Secrets key is kept in the cluster's state "
            f"({encryption.KEY_STATE}): apply the kubernetes role with encrypt_secrets first"
        )
    job.current = cfg_state.read_text().strip()
    run_flow(
        KUBERNETES_ROTATE_SECRETS_KEY,
        job,
        error=KubernetesOperationError,
        skip=skip,
        only=only,
        progress=progress,
    )
    return job.outcome


def rotate_new_key(job: RotateRun) -> None:
    job.next = kept_secret(job.loaded.state_dir, encryption.NEXT_KEY_STATE, encryption.new_key)
    if job.next == job.current:  # a state copied by hand: nothing would rotate
        raise KubernetesOperationError(
            f"{encryption.NEXT_KEY_STATE} holds the kept key itself; remove it and run again"
        )
    job.outcome.notes.append(
        f"rotating from {encryption.key_name(job.current)} to {encryption.key_name(job.next)}"
    )


def _loaded_everywhere(job: RotateRun, action: str, *secrets: str) -> None:
    """Give every control-plane node the file with these keys, then wait until each API
    server reports it loaded."""
    text = encryption.config_file_text(*secrets)
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    path = encryption.ENCRYPTION_CONFIG
    write = (
        f"umask 077 && cat > {path}.gpuinfra-new && chmod 0600 {path}.gpuinfra-new && "
        f"mv {path}.gpuinfra-new {path}"
    )
    loaded = f"{LOCAL_METRICS} | grep '^{LOADED_METRIC}' | grep -qF 'hash=\"{digest}\"'"
    wait = _wait(loaded, RELOAD_WAIT_S)
    job.written = []
    for host in job.loaded.cluster.in_group("control_plane"):
        job.command(host, f"{action}: write the key file", write, stdin=text.encode())
        job.written.append(host)
        job.command(host, f"{action}: wait until the API server loaded it", wait, timeout=240)


def rotate_add(job: RotateRun) -> None:
    _loaded_everywhere(job, "add the next key", job.current, job.next)


def rotate_switch(job: RotateRun) -> None:
    _loaded_everywhere(job, "encrypt with the next key", job.next, job.current)


def rotate_rewrite(job: RotateRun) -> None:
    """Every Secret replaced as it is (a conflict with a concurrent write: tried again), then
    etcd read on an etcd member: none may still be under the old key."""
    first = _first(job.loaded)
    replace = f"{KUBECTL} get secrets -A -o json | {KUBECTL} replace -f - >/dev/null"
    job.command(
        first,
        "rewrite every Secret with the next key",
        f"for i in 1 2 3; do {replace} && exit 0; sleep 5; done; exit 1",
        timeout=1800,
    )
    old = f"k8s:enc:{encryption.PROVIDER}:v1:{encryption.key_name(job.current)}:"
    count = (
        f"set -o pipefail; set -a; . {ETCDCTL_ENV}; set +a; "
        f'etcdctl --endpoints="$GPUINFRA_ETCD_ENDPOINTS" get --prefix {SECRETS_PREFIX} '
        f"--print-value-only | {{ grep -a -c -F {shlex.quote(old)} || true; }}"
    )
    member = job.loaded.cluster.in_group("etcd")[0]
    left = job.command(
        member, "count the Secrets etcd holds under the old key", f"bash -c {shlex.quote(count)}"
    ).strip()
    if left != "0":
        raise KubernetesOperationError(
            f"{member}: etcd still holds {left} Secret(s) under the old key "
            f"{encryption.key_name(job.current)} after the rewrite"
        )


def rotate_drop(job: RotateRun) -> None:
    _loaded_everywhere(job, "drop the old key", job.next)
    state = job.loaded.state_dir
    with state_lock(state):
        os.replace(state / encryption.NEXT_KEY_STATE, state / encryption.KEY_STATE)
    job.outcome.notes.append(
        f"every API server encrypts and reads with {encryption.key_name(job.next)} alone; it is "
        f"the key kept in {encryption.KEY_STATE}"
    )


def rotate_left(job: RotateRun) -> str:
    done = ", ".join(job.written) or "none"
    return (
        f"nodes given this step's file: {done}; every API server still reads both keys. Run "
        "the command again to finish the rotation (each step is safe to repeat); an apply "
        "refuses to run until then"
    )
