"""Secrets encrypted at rest: the API server's EncryptionConfiguration, with a key the cluster
keeps in its state (0600, made once by apply), so etcd, its snapshots and its backups hold
Secrets only as ciphertext. kubeadm.py sets the flags and the mount that use it.

secretbox (XSalsa20 and Poly1305) is the provider upstream recommends for a local key: strong,
fast, no padding oracle (aescbc) and no nonce limit per key (aesgcm). `identity` is listed last
so Secrets written before encryption was on still read; rewriting them (`kubectl get secrets -A
-o json | kubectl replace -f -`) encrypts them too. The API server reloads the file when it
changes (--encryption-provider-config-automatic-reload), so a later key rotation needs no
restart: `gpuinfra kubernetes rotate-secrets-key` (day2/encryption.py) adds a new key beside the
kept one on every API server, makes it the one that encrypts, rewrites every Secret, checks etcd
holds none under the old key, then drops it. While a rotation is under way the next key is kept
beside the first (NEXT_KEY_STATE) and an apply stops (`rotation_findings`): the file it writes
holds one key.

That reload is also the hazard: a file with another key, written over the one the API servers
encrypt with (a checkout without the cluster's state makes a new key), leaves every Secret
written since unreadable at once. `lost_keys` is the deploy's check before the file is written:
the apply stops on that node instead."""

from __future__ import annotations

import base64
import hashlib
import os

from inventory.model import LoadedCluster, StateAccess
from roles.kubernetes import models as m
from toolkit.spec import ManagedFile
from toolkit.statefiles import kept_secret

ENCRYPTION_DIR = "/etc/kubernetes/encryption"
ENCRYPTION_CONFIG = f"{ENCRYPTION_DIR}/config.yaml"
KEY_STATE = "kubernetes/secrets-encryption.key"  # under the cluster's state directory
# The key a rotation is moving to, until it is done (then it replaces KEY_STATE).
NEXT_KEY_STATE = "kubernetes/secrets-encryption.next.key"
KEY_BYTES = 32  # secretbox takes a 32-byte key
PROVIDER = "secretbox"
# The API server's flag that reads the file (roles/kubernetes/kubeadm.py sets it).
FLAG = "encryption-provider-config"


def new_key() -> str:
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def key(loaded: LoadedCluster) -> str:
    """The kept key. Missing while plan or drift reads the state (before the kubernetes role's
    first apply, or on a cluster applied by a gpuinfra without it): a placeholder, so the file
    shows as one the next apply makes, where a missing etcd CA stops them instead."""
    access = loaded.state_access
    if access is StateAccess.existing:
        access = StateAccess.placeholder
    return kept_secret(loaded.state_dir, KEY_STATE, new_key, access)


def key_name(secret: str) -> str:
    """The key's name in the configuration and in every value it encrypts (etcd holds
    `k8s:enc:secretbox:v1:<name>:`): derived from the key, so a rotated key is told apart
    without naming anything secret."""
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def configuration(*secrets: str) -> m.EncryptionConfiguration:
    """The keys in order: the first encrypts, every one decrypts (then `identity`)."""
    keys = [{"name": key_name(secret), "secret": secret} for secret in secrets]
    return m.EncryptionConfiguration(
        resources=[
            m.EncryptedResources(
                resources=["secrets"],
                providers=[{PROVIDER: {"keys": keys}}, {"identity": {}}],
            )
        ]
    )


def config_file_text(*secrets: str) -> str:
    return m.dump(
        [configuration(*secrets)],
        "# Managed by gpuinfra: Secrets encrypted at rest (roles/kubernetes/encryption.py).\n",
    )


def config_file(loaded: LoadedCluster) -> ManagedFile:
    text = config_file_text(key(loaded))
    return ManagedFile("kubernetes", ENCRYPTION_CONFIG, text, mode="0600", secret=True)


def lost_keys(on_node: list[str], kept: str) -> list[str]:
    """Findings for a node whose configuration lists keys the file about to be written drops:
    it has only the kept key (`on_node`: roles/kubernetes/facts.py's EncryptionKeyNames, none
    without the file). A key added by hand is one too: the apply would drop it."""
    name = key_name(kept)
    dropped = [other for other in on_node if other != name]
    if not dropped:
        return []
    return [
        f"{ENCRYPTION_CONFIG} encrypts Secrets with {', '.join(dropped)}, which the file this "
        f"apply writes lacks: it has only the key kept in the cluster's state ({name}), and "
        "the Secrets written with the others would no longer read. Restore "
        f"{KEY_STATE} under the state directory from the checkout that applied the cluster "
        "(docs/roles/kubernetes.md#secrets-at-rest)"
    ]


def unencrypted(running_flags: list[str] | None, manifest: str) -> list[str]:
    """A finding for an API server whose manifest (`running_flags`: roles/kubernetes/facts.py's
    ManifestFlags, None before the node's init or join) gives it no encryption configuration:
    kubeadm writes the manifest at init, join and upgrade only, so on a cluster initialised
    without encryption an apply writes the file and the running API server never reads it,
    storing every Secret in clear while the inventory says they are encrypted."""
    if running_flags is None or f"--{FLAG}" in running_flags:
        return []
    return [
        f"{manifest} runs the API server without --{FLAG}: it stores Secrets in etcd in clear "
        "(the cluster was initialised without encryption, and kubeadm writes the manifest at "
        "init, join and upgrade only). Turn it on as docs/roles/kubernetes.md#secrets-at-rest "
        "says, or set kubernetes.encrypt_secrets: false to run without it"
    ]


def rotation_findings(loaded: LoadedCluster) -> list[str]:
    """An apply stops while a key rotation is under way: the file it writes holds the kept key
    alone, and the API servers may already encrypt with the next one."""
    if not (loaded.state_dir / NEXT_KEY_STATE).exists():
        return []
    return [
        f"a rotation of the Secrets key is under way ({NEXT_KEY_STATE} is in the cluster's "
        "state): finish it with `gpuinfra kubernetes rotate-secrets-key` (each step is safe to "
        "run again) before applying the kubernetes role"
    ]
