"""The Go programs a lab cluster runs, built on this machine from the pinned modules in go/.

Each folder of go/ is a Go module of ours: its go.mod pins the versions (Kubernetes, CoreDNS,
the CNI plugins, the image registry, crane) and its go.sum their checksums; its `tool` lines
name the commands to build. Nothing is downloaded but modules through the Go module proxy, and
nothing of another project is kept in the repository. The binaries land in a cache outside the
repository, one folder per module and digest of its pins, so a machine builds each version once
(`python -m lab.gobuild`, run by `make install`) and every checkout and lab shares the result.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from inventory.versions import KubernetesVersion
from lab.errors import LabError, LabMissingTool

MODULES_DIR = Path(__file__).resolve().parents[1] / "go"
CACHE_DIR = Path(os.environ.get("GPUINFRA_GO_CACHE", "/var/cache/gpuinfra/go"))
COMPLETE = ".complete"
# Static binaries (no libc): they run from images with nothing else in them.
GO_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -trimpath"}
_TOOL_BLOCK = re.compile(r"^tool\s*\(\n(.*?)^\)", re.M | re.S)
_TOOL_LINE = re.compile(r"^tool\s+([^\s(]\S*)\s*$", re.M)
# kubeadm reads its own version to choose the control plane's; the components report theirs.
_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
# containerd reports this version over CRI, where kubelet reads which containerd it talks to.
CONTAINERD = "github.com/containerd/containerd/v2"


# Built by the command that needs them, not by `make install`: kwok (simulated nodes, `gpuinfra
# lab fleet`) compiles about as many packages as kubectl, minutes that a lab without a fleet
# never uses; the conformance suite (`gpuinfra kubernetes conformance`) compiles more than the
# cluster's own binaries together.
ON_FIRST_USE = frozenset({"kwok", "conformance-1.35"})
# go/conformance-<minor>: the Kubernetes conformance suite and its images' programs, pinned as
# the cluster's build of that minor is (docs/conformance.md).
CONFORMANCE_PREFIX = "conformance-"
# `go test -c` programs of a conformance module: the suite is a package's test, not a command.
CONFORMANCE_TESTS = {"e2e.test": "k8s.io/kubernetes/test/e2e"}


class GoBuildFailed(LabError):
    """go install failed; the message names the module and the log that holds go's output."""


@dataclass(frozen=True)
class GoModule:
    name: str
    path: Path

    @property
    def go_mod(self) -> str:
        return (self.path / "go.mod").read_text()

    def requirement(self, module: str) -> str | None:
        """The version go.mod requires of module (direct or indirect), or None."""
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", self.go_mod, re.M)
        return match.group(1) if match else None

    def tools(self) -> list[str]:
        """The packages named by go.mod's tool lines; none means the module itself is a main."""
        text = self.go_mod
        block = _TOOL_BLOCK.search(text)
        names = block.group(1).split() if block else []
        return sorted(names + _TOOL_LINE.findall(text))

    def test_programs(self) -> dict[str, str]:
        """The programs `go test -c` builds, by name: the suite, for a conformance module."""
        return dict(CONFORMANCE_TESTS) if self.name.startswith(CONFORMANCE_PREFIX) else {}

    def ldflags(self) -> str:
        flags = ["-s", "-w"]
        kubernetes = self.requirement("k8s.io/kubernetes")
        if kubernetes:
            version = KubernetesVersion.parse(kubernetes)
            for package in _VERSION_PACKAGES:
                flags += [
                    f"-X {package}.gitVersion={kubernetes}",
                    f"-X {package}.gitMajor={version.major}",
                    f"-X {package}.gitMinor={version.minor}",
                    f"-X {package}.gitTreeState=clean",
                ]
        containerd = self.requirement(CONTAINERD)
        if containerd:
            flags.append(f"-X {CONTAINERD}/version.Version={containerd}")
        return " ".join(flags)

    def digest(self) -> str:
        """What the binaries depend on: the pins, our own sources and the flags we build with."""
        digest = hashlib.sha256()
        sources = [self.path / "go.mod", self.path / "go.sum", *sorted(self.path.glob("*.go"))]
        for source in sources:
            if source.is_file():
                digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
        digest.update(self.ldflags().encode())
        if self.test_programs():  # only then: every other module's key stays as it was
            digest.update(repr(sorted(self.test_programs().items())).encode())
        digest.update(repr(sorted(GO_ENV.items())).encode())
        return digest.hexdigest()[:16]

    @property
    def output(self) -> Path:
        return CACHE_DIR / f"{self.name}-{self.digest()}"

    @property
    def built(self) -> bool:
        return (self.output / COMPLETE).is_file()

    def binary(self, program: str) -> Path:
        """The built program's path; an error saying how to build it when it is not built."""
        path = self.output / "bin" / program
        if not self.built or not path.is_file():
            raise LabError(
                f"{program} of go/{self.name} is not built on this machine: run `make install` "
                "(or `python -m lab.gobuild`)"
            )
        return path


def module(name: str) -> GoModule:
    path = MODULES_DIR / name
    if not (path / "go.mod").is_file():
        raise LabError(f"no Go module go/{name} in {MODULES_DIR.parent} (a source checkout?)")
    return GoModule(name, path)


def modules() -> list[GoModule]:
    return [module(p.name) for p in sorted(MODULES_DIR.iterdir()) if (p / "go.mod").is_file()]


def kubernetes_modules() -> list[GoModule]:
    """The Kubernetes builds, oldest first (go/kubernetes-<minor>; a conformance module pins
    k8s.io/kubernetes too, but builds the suite, not a cluster)."""
    found = [
        m
        for m in modules()
        if m.requirement("k8s.io/kubernetes") and not m.name.startswith(CONFORMANCE_PREFIX)
    ]
    return sorted(found, key=lambda m: _version_key(m.requirement("k8s.io/kubernetes") or ""))


def lab_modules() -> list[GoModule]:
    """What a lab cluster runs: every module but the Kubernetes builds newer than the oldest,
    which only an upgrade needs (`python -m lab.gobuild --module kubernetes-1.36`), and those
    built on first use.
    Each Kubernetes build is about 12 minutes cold on 2 cores: `make install` builds one."""
    newer = {m.name for m in kubernetes_modules()[1:]}
    return [m for m in modules() if m.name not in newer and m.name not in ON_FIRST_USE]


def kubernetes_module(version: str) -> GoModule:
    """The build of one Kubernetes version (v1.35.4 or 1.35.4)."""
    wanted = KubernetesVersion.parse(version).tag
    for candidate in kubernetes_modules():
        if candidate.requirement("k8s.io/kubernetes") == wanted:
            return candidate
    built = ", ".join(m.requirement("k8s.io/kubernetes") or "" for m in kubernetes_modules())
    raise LabError(f"no Go module in go/ builds Kubernetes {wanted} (go/ has {built})")


def conformance_module(version: str) -> GoModule:
    """The conformance suite's build for one Kubernetes version (v1.35.4 or 1.35.4)."""
    wanted = KubernetesVersion.parse(version).tag
    for candidate in modules():
        pinned = candidate.requirement("k8s.io/kubernetes")
        if candidate.name.startswith(CONFORMANCE_PREFIX) and pinned == wanted:
            return candidate
    raise LabError(f"no Go module in go/ builds the conformance suite of Kubernetes {wanted}")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def build(target: GoModule, log=sys.stderr) -> Path:
    """Build the module's commands into the cache, unless this digest is built already."""
    if target.built:
        return target.output
    go = shutil.which("go")
    if go is None:
        raise LabMissingTool("go is not installed: the lab builds its cluster's programs with it")
    output = target.output
    staging = output.with_name(output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    packages = target.tools() and ["tool"] or ["."]
    env = {**os.environ, **GO_ENV, "GOBIN": str(staging / "bin")}
    started = time.monotonic()
    print(f"building go/{target.name} into {output} ...", file=log, flush=True)
    commands = [[go, "install", f"-ldflags={target.ldflags()}", *packages]]
    for program, package in target.test_programs().items():
        out = str(staging / "bin" / program)
        commands.append([go, "test", "-c", f"-ldflags={target.ldflags()}", "-o", out, package])
    with (staging / "build.log").open("w") as build_log:
        for command in commands:
            result = subprocess.run(
                command, cwd=target.path, env=env, capture_output=True, text=True
            )
            build_log.write(result.stdout + result.stderr)
            if result.returncode != 0:
                tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise GoBuildFailed(
                    f"go {command[1]} in go/{target.name} failed ({tail}); "
                    f"log: {staging / 'build.log'}"
                )
    (staging / COMPLETE).write_text(f"{time.monotonic() - started:.0f} s\n")
    shutil.rmtree(output, ignore_errors=True)
    staging.rename(output)
    print(f"built go/{target.name} in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return output


def main(argv: list[str] | None = None) -> int:
    """`python -m lab.gobuild`: build what a lab cluster runs; `... --all`: every module, the
    newer Kubernetes builds an upgrade goes to included; `... kubectl`: print the path of the
    lab's Kubernetes build's kubectl (what `make demo` reads the cluster with); `... --module
    conformance-1.35`: one module, such as one built on first use."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["--module"]:
            (name,) = args[1:]
            build(module(name))
            return 0
        if args and args != ["--all"]:
            (program,) = args
            print(kubernetes_modules()[0].binary(program))
            return 0
        for target in modules() if args == ["--all"] else lab_modules():
            build(target)
    except (LabError, ValueError, IndexError) as exc:
        print(f"error: {exc or 'no Kubernetes build in go/'}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
