"""Facts the kubernetes role reads from a node: installed versions, what kubeadm wrote."""

from __future__ import annotations

import shlex

import yaml
from pyinfra.api import FactBase


class KubeBinaries(FactBase):
    """The versions the installed kubeadm, kubelet and kubectl report, by name ({} when none):
    {"kubeadm": "v1.31.4", "kubelet": "v1.31.4", "kubectl": "v1.31.4"}."""

    default = dict

    def command(self) -> str:
        return (
            "for b in kubeadm kubelet kubectl; do command -v $b >/dev/null || continue; "
            "case $b in kubeadm) v=$(kubeadm version -o short 2>/dev/null);; "
            "kubelet) v=$(kubelet --version 2>/dev/null | awk '{print $2}');; "
            "kubectl) v=$(kubectl version --client -o json 2>/dev/null "
            '| sed -n \'s/.*"gitVersion": *"\\([^"]*\\)".*/\\1/p\' | head -n1);; esac; '
            'echo "$b=$v"; done'
        )

    def process(self, output: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for line in output:
            name, _, value = line.strip().partition("=")
            if name and value:
                found[name] = value
        return found


class ApiAnswers(FactBase):
    """Whether the API answers /healthz with "ok" through a kubeconfig on this node, and the
    kubeconfig exists: {"kubeconfig": bool, "healthy": bool}."""

    def command(self, kubeconfig: str) -> str:
        quoted = shlex.quote(kubeconfig)
        return (
            f"if test -f {quoted}; then echo present; "
            f"kubectl --kubeconfig {quoted} --request-timeout=5s get --raw /healthz 2>/dev/null "
            "|| true; echo; else echo absent; fi"
        )

    def process(self, output: list[str]) -> dict[str, bool]:
        lines = [line.strip() for line in output if line.strip()]
        present = bool(lines) and lines[0] == "present"
        return {"kubeconfig": present, "healthy": present and "ok" in lines[1:]}


class FileExists(FactBase):
    def command(self, path: str) -> str:
        return f"test -e {shlex.quote(path)} && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


class LiveObjectsDiffer(FactBase):
    """`kubectl diff --server-side` of the placed object files against the live objects, as the
    role's apply would send them: {"status": "same" (exit 0), "differs" (1) or "failed"
    (anything else: no API, or a custom resource whose definition is not there yet),
    "differences": ["PriorityClass gpuinfra-balloon: description: 'edited by hand' live,
    'Placeholder pods ...' in the files", ...]}. Only the changed lines leave the node, at most
    DIFF_LINES of them, and none of a Secret's (its object is named, its data never)."""

    def command(self, kubeconfig: str, paths: tuple[str, ...], field_manager: str) -> str:
        files = " ".join(f"-f {shlex.quote(path)}" for path in paths)
        keep = (
            "/^diff /{secret=($0 ~ /[/.]v1[.]Secret[.]/); print; next} "
            "!secret && /^[-+]/ && !/^(---|[+][+][+]) / {print}"
        )
        return (
            f"out=$(kubectl --kubeconfig {shlex.quote(kubeconfig)} --request-timeout=30s diff "
            f"--server-side --field-manager={shlex.quote(field_manager)} --force-conflicts "
            f"{files} 2>/dev/null); rc=$?; "
            f"printf '%s\\n' \"$out\" | awk {shlex.quote(keep)} | head -n {DIFF_LINES}; "
            'echo "exit=$rc"'
        )

    def process(self, output: list[str]) -> dict[str, object]:
        lines = [line for line in output if line.strip()]
        status = lines[-1].strip().removeprefix("exit=") if lines else ""
        return {
            "status": {"0": "same", "1": "differs"}.get(status, "failed"),
            "differences": live_differences(lines[:-1]),
        }


# Lines of kubectl diff a node sends back at most (the first objects that differ are enough to
# say what was edited; the apply puts back all of them).
DIFF_LINES = 200
# Lines every server-side diff shows that say nothing about an edit.
_BOOKKEEPING = ("generation:", "resourceVersion:", "managedFields", "time:", "manager:")


def live_differences(lines: list[str]) -> list[str]:
    """One finding per object that differs: its kind and name, and each changed line, live
    (-) then as the files have it (+). A Secret is named only."""
    found: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith("diff "):
            # diff -u -N /tmp/LIVE-1/<group.version.Kind.namespace.name> /tmp/MERGED-1/...
            name = line.split()[-1].rsplit("/", 1)[-1]
            parts = name.split(".")
            kind = parts[-3] if len(parts) >= 3 else name
            namespace, object_name = parts[-2], parts[-1]
            current = f"{kind} {namespace + '/' if namespace else ''}{object_name}"
            found[current] = []
            continue
        text = line[1:].strip()
        secret = current is not None and current.startswith("Secret ")
        if current is None or secret or not text or any(word in text for word in _BOOKKEEPING):
            continue
        found[current].append(f"{'live' if line[0] == '-' else 'files'}: {text}")
    return [
        f"{name}: {'; '.join(changes) if changes else 'data differs (not shown)'}"
        for name, changes in found.items()
    ]


class EncryptionKeyNames(FactBase):
    """The names of the keys the node's EncryptionConfiguration lists, in order ([] without
    the file): names only, never a secret (the file is 0600; gpuinfra's names are a hash's
    first 12 hex digits, roles/kubernetes/encryption.py)."""

    default = list

    def command(self, path: str) -> str:
        names = "s/^[[:space:]-]*name:[[:space:]]*//p"
        return f"sed -n '{names}' {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip().strip("\"'") for line in output if line.strip()]


class ManifestFlags(FactBase):
    """The `--name` of each flag a static pod manifest (`path`) gives its command, in order;
    None without the manifest (a node before its init or join)."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        flags = r"s/^[[:space:]]*-[[:space:]]*\(--[a-z0-9-]*\).*/\1/p"
        return f"test -f {quoted} && echo manifest && sed -n '{flags}' {quoted} || true"

    def process(self, output: list[str]) -> list[str] | None:
        lines = [line.strip() for line in output if line.strip()]
        if not lines or lines[0] != "manifest":
            return None
        return lines[1:]


class KubeletConfigFile(FactBase):
    """kubelet's configuration file as kubeadm wrote it (`path`), parsed; None before the node
    joined (no file) or when it is no YAML mapping."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict | None:
        try:
            found = yaml.safe_load("\n".join(output))
        except yaml.YAMLError:
            return None
        return found if isinstance(found, dict) else None


class CgroupVersion(FactBase):
    """The host's cgroup hierarchy, by the file system at /sys/fs/cgroup: "v2" (cgroup2fs),
    "v1" (a tmpfs of v1 controllers), or None when it reads as neither."""

    def command(self) -> str:
        return "stat -fc %T /sys/fs/cgroup 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        kind = output[0].strip() if output else ""
        return {"cgroup2fs": "v2", "tmpfs": "v1"}.get(kind)
