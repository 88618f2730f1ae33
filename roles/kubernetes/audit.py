"""The API server's audit policy: what it records (metadata of every write, nothing of reads or
of secrets' bodies) and where the log goes; kubeadm.py sets the flags and mounts that use it."""

from __future__ import annotations

from toolkit.spec import ManagedFile
from toolkit.templates import render_template

AUDIT_POLICY = "/etc/kubernetes/audit-policy.yaml"
AUDIT_LOG_DIR = "/var/log/kubernetes/audit"


def policy_file() -> ManagedFile:
    text = render_template("kubernetes/audit-policy.yaml.j2")
    return ManagedFile("kubernetes", AUDIT_POLICY, text, mode="0600")
