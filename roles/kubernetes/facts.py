"""Facts the kubernetes role reads from a node: installed versions, what kubeadm wrote."""

from __future__ import annotations

import shlex

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
    role's apply would send them: "same" (exit 0), "differs" (1) or "failed" (anything else:
    no API, or a custom resource whose definition is not there yet). Its output (which would
    show a Secret's data) is thrown away; only the exit status is read."""

    def command(self, kubeconfig: str, paths: tuple[str, ...], field_manager: str) -> str:
        files = " ".join(f"-f {shlex.quote(path)}" for path in paths)
        return (
            f"kubectl --kubeconfig {shlex.quote(kubeconfig)} --request-timeout=30s diff "
            f"--server-side --field-manager={shlex.quote(field_manager)} --force-conflicts "
            f"{files} >/dev/null 2>&1; echo $?"
        )

    def process(self, output: list[str]) -> str:
        status = output[-1].strip() if output else ""
        return {"0": "same", "1": "differs"}.get(status, "failed")
