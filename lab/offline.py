"""The lab's offline install sources: an image registry and a file server on the machine.

Nothing a lab cluster runs comes from the internet (LAB.md: no Kubernetes repository, no release
downloads, no public registry). As Kubespray's offline mode does, the cluster's binaries come
from a file server and its images from a registry mirror, both filled from what this machine
built from Go modules (lab/gobuild.py):
- the file server holds kubeadm, kubelet and kubectl under the release layout the kubernetes
  role downloads from (`<base>/v<version>/bin/linux/amd64/<name>`) and the CNI plugins tarball,
  each checked by the role against the SHA-256 that the lab's inventory pins;
- the registry (CNCF distribution's `registry`) serves kube-apiserver, kube-controller-manager,
  kube-scheduler, kube-proxy, CoreDNS and pause under the names kubeadm asks for, so a node's
  containerd reaches it as a mirror of registry.k8s.io, as it would a fleet's own mirror.
Both listen on 127.0.0.1 only; each lab's nftables table forwards the bridge's gateway address
on their ports to them (network.ensure_nat), as it does for the package cache.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from lab import gobuild, processes, rootfs
from lab.errors import LabError

LISTEN = "127.0.0.1"
REGISTRY_PORT = 5000  # the registry's usual port
FILES_PORT = 3144  # beside the package cache's 3143
RUN_DIR = Path("/var/lib/gpuinfra/offline")
# Outside the repository and shared by every lab, like the root filesystem and the Go builds.
REGISTRY_DIR = Path("/var/cache/gpuinfra/registry")
FILES_DIR = Path("/var/cache/gpuinfra/files")
BASE_DIR = Path("/var/cache/gpuinfra/image-bases")
START_TIMEOUT_S = 15.0
UPSTREAM_REGISTRY = "registry.k8s.io"
KUBERNETES_FILES = "kubernetes/release"  # under FILES_DIR: kubeadm's release layout
CNI_FILES = "cni-plugins"
ETCD_FILES = "etcd"
CONTAINERD_FILES = "containerd"  # containerd's release layout: v<version>/containerd-....tar.gz
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
# kube-proxy programs the kernel through nft (nftables mode) or iptables: its image needs them,
# and a Debian root with just those is the smallest honest base (the upstream image is a
# distroless root with iptables).
PROXY_BASE_PACKAGES = ("nftables", "iptables", "conntrack")
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
TOOLBOX = "gpuinfra/toolbox"
TOOLBOX_TAG = rootfs.SUITE
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Published:
    """What a lab inventory needs to install a cluster from these sources."""

    kubernetes_version: str  # v1.35.4
    coredns_version: str  # v1.14.7
    cni_plugins_version: str  # 1.10.0
    pause_tag: str
    etcd_version: str  # 3.6.16: kubeadm 1.35 refuses an external etcd older than 3.5.24
    etcd_sha256: str
    sha256: dict[str, str]  # kubeadm, kubelet, kubectl, cni-plugins
    containerd_version: str  # 2.2.9: Kubernetes 1.36 needs containerd 2; Debian 13 ships 1.7
    containerd_sha256: str
    gpuinfra_image: str  # gpuinfra/gpuinfra:<version>-<digest>, under the registry's own name

    def to_json(self) -> dict:
        return {
            "gpuinfra_image": self.gpuinfra_image,
            "kubernetes_version": self.kubernetes_version,
            "coredns_version": self.coredns_version,
            "cni_plugins_version": self.cni_plugins_version,
            "pause_tag": self.pause_tag,
            "etcd_version": self.etcd_version,
            "etcd_sha256": self.etcd_sha256,
            "sha256": self.sha256,
            "containerd_version": self.containerd_version,
            "containerd_sha256": self.containerd_sha256,
        }


def registry_url(gateway: str) -> str:
    return f"http://{gateway}:{REGISTRY_PORT}"


def files_url(gateway: str) -> str:
    return f"http://{gateway}:{FILES_PORT}"


def gpuinfra_image(gateway: str, published: Published) -> str:
    """gpuinfra's own image (the GPU health pods run it), by the name a lab host pulls it under."""
    return f"{gateway}:{REGISTRY_PORT}/{published.gpuinfra_image}"


def toolbox_image(gateway: str) -> str:
    """The lab's test pods' image, by the name a lab host pulls it under."""
    return f"{gateway}:{REGISTRY_PORT}/{TOOLBOX}:{TOOLBOX_TAG}"


# ---------------------------------------------------------------- the two services


def _pid_file(name: str) -> Path:
    return RUN_DIR / f"{name}.pid"


def _running(name: str, marker: bytes) -> int | None:
    try:
        pid = int(_pid_file(name).read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if processes.alive(pid) and marker in cmdline else None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((LISTEN, port), timeout=1):
            return True
    except OSError:
        return False


def _start(
    name: str, argv: list[str], port: int, marker: bytes, env: dict[str, str] | None = None
) -> int:
    pid = _running(name, marker)
    if pid is not None and _answers(port):
        return pid
    if pid is not None:
        processes.stop([pid], deadline_s=5)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    log = (RUN_DIR / f"{name}.log").open("ab")
    # Its own session: it outlives the `gpuinfra lab up` that started it.
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    _pid_file(name).write_text(f"{child.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            break
        if _answers(port):
            return child.pid
        time.sleep(0.1)
    raise LabError(f"the lab's {name} did not answer on {LISTEN}:{port}; see {log.name}")


def registry_config() -> str:
    return json.dumps(
        {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(REGISTRY_DIR)}},
            "http": {"addr": f"{LISTEN}:{REGISTRY_PORT}"},
        },
        indent=2,
    )


def ensure_running() -> None:
    """Start the registry and the file server unless they answer already."""
    tools = gobuild.module("cluster-tools")
    registry = tools.binary("registry")
    for folder in (REGISTRY_DIR, FILES_DIR, RUN_DIR):
        folder.mkdir(parents=True, exist_ok=True)
    config = RUN_DIR / "registry.json"  # YAML's superset: the registry reads JSON as is
    config.write_text(registry_config())
    # The registry exports OpenTelemetry traces to localhost:4318 unless told not to.
    quiet = {"OTEL_TRACES_EXPORTER": "none"}
    _start("registry", [str(registry), "serve", str(config)], REGISTRY_PORT, b"registry", quiet)
    server = [
        shutil.which("python3") or "python3", "-m", "http.server",
        "--bind", LISTEN, "--directory", str(FILES_DIR), str(FILES_PORT),
    ]  # fmt: skip
    _start("files", server, FILES_PORT, b"http.server")


def stop() -> None:
    for name, marker in (("registry", b"registry"), ("files", b"http.server")):
        pid = _running(name, marker)
        if pid is not None:
            processes.stop([pid], deadline_s=5)


# ---------------------------------------------------------------- what they serve


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _place(source: Path, target: Path) -> None:
    """target becomes source's content, replaced atomically (a hard link where possible)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}.new")
    staged.unlink(missing_ok=True)
    try:
        os.link(source, staged)
    except OSError:
        shutil.copy2(source, staged)
    staged.replace(target)


def _tar_files(members: dict[str, Path], mode: int = 0o755) -> bytes:
    """A tar of files at the given paths, owned by root, dated 0: the same bytes every time."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        folders: set[str] = set()
        for name in sorted(members):
            parts = name.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode = members[name].stat().st_size, mode
            with members[name].open("rb") as content:
                archive.addfile(info, content)
    return out.getvalue()


def publish_files(kubernetes: gobuild.GoModule) -> dict[str, str]:
    """kubeadm, kubelet, kubectl and the CNI plugins on the file server; their SHA-256 pins."""
    version = kubernetes.requirement("k8s.io/kubernetes") or ""
    tools = gobuild.module("cluster-tools")
    pins: dict[str, str] = {}
    release = FILES_DIR / KUBERNETES_FILES / version / "bin/linux/amd64"
    for name in ("kubeadm", "kubelet", "kubectl"):
        _place(kubernetes.binary(name), release / name)
        pins[name] = _sha256(release / name)
    cni_version = tools.requirement("github.com/containernetworking/plugins") or ""
    archive = FILES_DIR / CNI_FILES / cni_version / f"cni-plugins-linux-amd64-{cni_version}.tgz"
    if not archive.is_file():
        _write_tarball(archive, {f"./{name}": tools.binary(name) for name in CNI_PLUGINS})
    pins["cni-plugins"] = _sha256(archive)
    return pins


def publish_etcd() -> tuple[str, str]:
    """etcd, etcdctl and etcdutl in the upstream release's tarball layout (what the etcd role's
    source: mirror downloads); returns the version and the tarball's SHA-256."""
    build = gobuild.module("etcd-3.6")
    version = (build.requirement("go.etcd.io/etcd/server/v3") or "").lstrip("v")
    folder = f"etcd-v{version}-linux-amd64"
    archive = FILES_DIR / ETCD_FILES / f"{folder}.tar.gz"
    if not archive.is_file():
        # go names the server's binary after its package (go.etcd.io/etcd/server/v3): server.
        members = {
            f"{folder}/etcd": build.binary("server"),
            f"{folder}/etcdctl": build.binary("etcdctl"),
            f"{folder}/etcdutl": build.binary("etcdutl"),
        }
        _write_tarball(archive, members)
    return version, _sha256(archive)


def publish_containerd() -> tuple[str, str]:
    """containerd, its runc shim and ctr in the upstream release's tarball layout (what the
    container_runtime role's source: binaries downloads); returns the version and its SHA-256."""
    build = gobuild.module("containerd-2")
    version = (build.requirement(gobuild.CONTAINERD) or "").lstrip("v")
    name = f"containerd-{version}-linux-amd64.tar.gz"
    archive = FILES_DIR / CONTAINERD_FILES / f"v{version}" / name
    if not archive.is_file():
        programs = ("containerd", "containerd-shim-runc-v2", "ctr")
        _write_tarball(archive, {f"bin/{name}": build.binary(name) for name in programs})
    return version, _sha256(archive)


def _write_tarball(archive: Path, members: dict[str, Path]) -> None:
    """A gzipped tar of members at archive, replaced atomically, the same bytes every time."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    staged = archive.with_name(f".{archive.name}.new")
    with staged.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as packed:
        packed.write(_tar_files(members))
    staged.replace(archive)


def _crane(*args: str) -> str:
    crane = gobuild.module("cluster-tools").binary("crane")
    result = subprocess.run(
        [str(crane), "--insecure", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"crane {args[0]} failed: {tail}")
    return result.stdout.strip()


_MANIFESTS = (
    "application/vnd.oci.image.manifest.v1+json,"
    "application/vnd.docker.distribution.manifest.v2+json"
)


def _has_image(name: str, tag: str) -> bool:
    url = f"http://{LISTEN}:{REGISTRY_PORT}/v2/{name}/manifests/{tag}"
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": _MANIFESTS})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def _push_image(
    name: str,
    tag: str,
    layers: list[Path],
    entrypoint: str | None,
    *,
    label: str,
    env: tuple[str, ...] = (),
    cmd: tuple[str, ...] = (),
) -> None:
    """name:tag in the registry: the given layers on an empty base, with PATH, entrypoint (None:
    none, as a shell image has) and default arguments.

    The label records what the image was built from, so a rebuilt binary replaces the image."""
    reference = f"{LISTEN}:{REGISTRY_PORT}/{name}:{tag}"
    if _has_image(name, tag) and _label_of(reference) == label:
        return
    args = ["append", "--new_tag", reference]
    for layer in layers:
        args += ["--new_layer", str(layer)]
    _crane(*args)
    extra = [arg for variable in env for arg in ("--env", variable)]
    if entrypoint is not None:
        extra += ["--entrypoint", entrypoint]
    if cmd:  # crane splits the list at commas
        extra += ["--cmd", ",".join(cmd)]
    _crane(
        "mutate", reference,
        "--set-platform", "linux/amd64",
        "--env", PATH_ENV,
        *extra,
        "--label", f"gpuinfra.build={label}",
    )  # fmt: skip


def _label_of(reference: str) -> str | None:
    try:
        config = json.loads(_crane("config", reference))
    except (LabError, ValueError):
        return None
    return ((config.get("config") or {}).get("Labels") or {}).get("gpuinfra.build")


def _layer_file(name: str, members: dict[str, Path], mode: int = 0o755) -> tuple[Path, str]:
    """A cached layer tarball of the members, and the digest that names what it holds."""
    content = _tar_files(members, mode)
    digest = hashlib.sha256(content).hexdigest()[:16]
    layer = BASE_DIR / f"{name}-{digest}.tar"
    if not layer.is_file():
        layer.parent.mkdir(parents=True, exist_ok=True)
        staged = layer.with_name(f".{layer.name}.new")
        staged.write_bytes(content)
        staged.replace(layer)
    return layer, digest


def proxy_base(mirror: rootfs.Mirror) -> Path:
    """A layer of a minimal Debian 13 root with nft and iptables, built once per machine."""
    return _debian_base("kube-proxy-base", PROXY_BASE_PACKAGES, mirror)


def _debian_base(
    name: str,
    packages: tuple[str, ...],
    mirror: rootfs.Mirror,
    accounts: tuple[tuple[str, int], ...] = (),
    setup: tuple[tuple[str, ...], ...] = (),
    files: dict[str, Path] | None = None,
) -> Path:
    """A layer of a minimal Debian 13 root with these packages and accounts (name, uid, a
    group of the same number, no login) and these files (path in the root: file on this
    machine), then the setup commands run inside it, built once per machine and list (the lists
    are in its name: a package added is a new layer, not the old one)."""
    what = " ".join(sorted(packages)) + "".join(f" {user}:{uid}" for user, uid in accounts)
    what += "".join(" !" + " ".join(command) for command in setup)  # none: the key as it was
    for member, source in sorted((files or {}).items()):
        what += f" +{member}:{hashlib.sha256(source.read_bytes()).hexdigest()}"
    listed = hashlib.sha256(what.encode()).hexdigest()[:12]
    layer = BASE_DIR / f"{name}-{rootfs.SUITE}-{listed}.tar"
    if layer.is_file():
        return layer
    BASE_DIR.mkdir(parents=True, exist_ok=True)
    build = BASE_DIR / f".{name}-{rootfs.SUITE}.build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    try:
        rootfs.debootstrap(build, mirror, rootfs.SUITE, packages)
        for user, uid in accounts:
            with open(build / "etc/passwd", "a") as passwd:
                passwd.write(f"{user}:x:{uid}:{uid}:{user}:/nonexistent:/usr/sbin/nologin\n")
            with open(build / "etc/group", "a") as group:
                group.write(f"{user}:x:{uid}:\n")
        for member, source in (files or {}).items():
            shutil.copy2(source, build / member)
        for command in setup:
            ran = subprocess.run(["chroot", str(build), *command], capture_output=True, text=True)
            if ran.returncode != 0:
                tail = (ran.stderr.strip().splitlines() or ["no output"])[-1]
                raise LabError(f"{' '.join(command)} in the {name} image failed: {tail}")
        for bulky in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt"):
            shutil.rmtree(build / bulky, ignore_errors=True)
        staged = layer.with_name(f".{layer.name}.new")
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(build), "-cf", str(staged), "."], check=True
        )
        staged.replace(layer)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return layer


def publish_images(kubernetes: gobuild.GoModule, mirror: rootfs.Mirror) -> tuple[str, str]:
    """Every image kubeadm pulls, built from this machine's binaries; returns the Kubernetes
    and CoreDNS tags."""
    version = kubernetes.requirement("k8s.io/kubernetes") or ""
    tools = gobuild.module("cluster-tools")
    coredns = tools.requirement("github.com/coredns/coredns") or ""
    for name in (*CONTROL_PLANE, "kube-proxy"):
        binary = f"usr/local/bin/{name}"
        layer, digest = _layer_file(name, {binary: kubernetes.binary(name)})
        layers = [proxy_base(mirror), layer] if name == "kube-proxy" else [layer]
        _push_image(name, version, layers, f"/{binary}", label=digest)
    layer, digest = _layer_file("coredns", {"coredns": tools.binary("coredns")})
    _push_image("coredns/coredns", coredns, [layer], "/coredns", label=digest)
    # A shell and a resolver for the lab's own test pods (the same Debian root, nothing else):
    # served under the lab registry's own name, not as a mirror of anyone's.
    base = proxy_base(mirror)
    _push_image(TOOLBOX, TOOLBOX_TAG, [base], "/bin/sh", label=f"base-{_sha256(base)[:16]}")
    pause = gobuild.module("pause")
    layer, digest = _layer_file("pause", {"pause": pause.binary("pause")})
    _push_image("pause", pause_tag(kubernetes), [layer], "/pause", label=digest)
    return version, coredns


def pause_tag(kubernetes: gobuild.GoModule) -> str:
    """The pause image's tag this kubeadm names (3.10.1 for 1.35, 3.10.2 for 1.36): kubeadm
    pulls it before an init or an upgrade, so each version's must be served."""
    version = kubernetes.requirement("k8s.io/kubernetes") or ""
    result = subprocess.run(
        [str(kubernetes.binary("kubeadm")), "config", "images", "list"]
        + ["--kubernetes-version", version],
        capture_output=True,
        text=True,
    )
    for image in result.stdout.split():
        if image.startswith(f"{UPSTREAM_REGISTRY}/pause:"):
            return image.rpartition(":")[2]
    raise LabError(f"kubeadm {version} names no pause image: {result.stderr.strip()[-200:]}")


# ---------------------------------------------------------------- gpuinfra's own image

GPUINFRA = "gpuinfra/gpuinfra"
# openssh-client: the drift Job's shards probe hosts over ssh (docs/fleet-jobs.md).
GPUINFRA_BASE_PACKAGES = ("python3", "openssh-client")  # Debian 13: Python 3.13
# The drift Job's pods run as uid 65532 (templates/drift_job/fleet-job.yaml.j2), and OpenSSH's
# client refuses to start for a uid without a passwd entry ("No user exists for uid").
GPUINFRA_ACCOUNTS = (("nonroot", 65532),)
GPUINFRA_PYTHON = "3.13"
GPUINFRA_LIB = "opt/gpuinfra/lib"
# Not in the image: rendering's offline schemas (108 MB), Ansible inventory import and testinfra
# verification run on the controller; the pods check GPUs, gate nodes and probe hosts.
GPUINFRA_LEFT_OUT = ("kubernetes-validate", "ansible-core", "pytest-testinfra")
GPUINFRA_WRAPPER = """#!/bin/sh
exec python3 -c 'import sys; from cli.launch import main; sys.argv[0] = "gpuinfra"; main()' "$@"
"""
REPO = Path(__file__).resolve().parents[1]


def _pip_target(target: Path, *requirements: str, deps: bool = True) -> None:
    """Install wheels for Debian 13's Python into target (binary wheels only, from PyPI or
    what the machine's pip is configured with; pip's own cache keeps a second build quick)."""
    argv = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--target", str(target), "--only-binary=:all:",
        "--python-version", GPUINFRA_PYTHON, "--implementation", "cp",
        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux2014_x86_64", "--platform", "linux_x86_64",
        *([] if deps else ["--no-deps"]), *requirements,
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"pip could not install {requirements[0]} for the gpuinfra image: {tail}")


def _runtime_requirements() -> list[str]:
    """gpuinfra's dependencies at the versions this controller runs, less GPUINFRA_LEFT_OUT."""
    wanted = []
    for requirement in metadata.requires("gpuinfra") or []:
        if "extra ==" in requirement:
            continue
        name = re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0]
        if name.lower() not in GPUINFRA_LEFT_OUT:
            wanted.append(f"{name}=={metadata.version(name)}")
    return sorted(wanted)


def _tree_layer(name: str, fill) -> tuple[Path, str]:
    """A cached layer of the tree `fill(root)` writes, named by the digest of its files."""
    BASE_DIR.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=BASE_DIR))
    try:
        fill(build)
        members = {
            str(path.relative_to(build)): path
            for path in sorted(build.rglob("*"))
            if path.is_file() and not path.is_symlink()
        }
        digest = hashlib.sha256()
        for member, path in members.items():
            digest.update(member.encode() + b"\0" + path.read_bytes() + b"\0")
        short = digest.hexdigest()[:16]
        layer = BASE_DIR / f"{name}-{short}.tar"
        if not layer.is_file():
            staged = layer.with_name(f".{layer.name}.new")
            subprocess.run(
                ["tar", "--numeric-owner", "--owner=0", "--group=0", "--mtime=@0", "--sort=name",
                 "-C", str(build), "-cf", str(staged), "."],
                check=True,
            )  # fmt: skip
            staged.replace(layer)
        return layer, short
    finally:
        shutil.rmtree(build, ignore_errors=True)


def publish_gpuinfra(kubernetes: gobuild.GoModule, mirror: rootfs.Mirror) -> str:
    """gpuinfra's image: Debian 13 with python3, gpuinfra's runtime dependencies at this
    controller's versions, gpuinfra itself from a wheel of this checkout, and kubectl. Its tag
    is gpuinfra's version and the digest of its layers, so changed code is a new tag."""
    requirements = _runtime_requirements()

    def dependencies(root: Path) -> None:
        _pip_target(root / GPUINFRA_LIB, *requirements)

    def code(root: Path) -> None:
        wheels = root.parent / f".{root.name}-wheel"
        try:
            built = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                 "--no-build-isolation", "--wheel-dir", str(wheels), str(REPO)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if built.returncode != 0:
                tail = (built.stderr.strip().splitlines() or ["no output"])[-1]
                raise LabError(f"pip could not build gpuinfra's wheel from {REPO}: {tail}")
            _pip_target(root / GPUINFRA_LIB, *map(str, wheels.glob("*.whl")), deps=False)
        finally:
            shutil.rmtree(wheels, ignore_errors=True)
        shutil.rmtree(root / GPUINFRA_LIB / "bin", ignore_errors=True)  # the controller's paths
        # Where pip took the wheel from (a temporary folder): the same code, another digest.
        for installed in (root / GPUINFRA_LIB).glob("gpuinfra-*.dist-info"):
            (installed / "direct_url.json").unlink(missing_ok=True)
            (installed / "RECORD").unlink(missing_ok=True)
        wrapper = root / "usr/local/bin/gpuinfra"
        wrapper.parent.mkdir(parents=True)
        wrapper.write_text(GPUINFRA_WRAPPER)
        wrapper.chmod(0o755)

    deps_key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    deps_layer = BASE_DIR / f"gpuinfra-deps-{deps_key}.tar"
    if not deps_layer.is_file():
        built, _ = _tree_layer("gpuinfra-deps", dependencies)
        built.replace(deps_layer)
    for old in BASE_DIR.glob("gpuinfra-code-*.tar"):  # one per checkout that was published
        old.unlink()
    code_layer, code_digest = _tree_layer("gpuinfra-code", code)
    kubectl, kubectl_digest = _layer_file(
        "kubectl", {"usr/local/bin/kubectl": kubernetes.binary("kubectl")}
    )
    base = _debian_base("gpuinfra-base", GPUINFRA_BASE_PACKAGES, mirror, GPUINFRA_ACCOUNTS)
    # One tag per base, code and kubectl: each Kubernetes build publishes its own, never
    # overwriting another's, and a base with other packages is another image.
    made_of = f"{base.stem}-{code_digest}-{kubectl_digest}"
    tag_digest = hashlib.sha256(made_of.encode()).hexdigest()
    tag = f"{metadata.version('gpuinfra')}-{tag_digest[:12]}"
    _push_image(
        GPUINFRA, tag, [base, deps_layer, kubectl, code_layer], "/usr/local/bin/gpuinfra",
        label=f"{base.stem}-{deps_key}-{kubectl_digest}-{code_digest}",
        env=(f"PYTHONPATH=/{GPUINFRA_LIB}",),
    )  # fmt: skip
    return f"{GPUINFRA}:{tag}"


def _record(version: str) -> Path:
    return RUN_DIR / f"published-{version}.json"


def publish(kubernetes: gobuild.GoModule, mirror: rootfs.Mirror) -> Published:
    """Fill the file server and the registry for one Kubernetes build (idempotent), and record
    what a lab inventory pins for it."""
    sha256 = publish_files(kubernetes)
    etcd_version, etcd_sha256 = publish_etcd()
    containerd_version, containerd_sha256 = publish_containerd()
    version, coredns = publish_images(kubernetes, mirror)
    image = publish_gpuinfra(kubernetes, mirror)
    cni = gobuild.module("cluster-tools").requirement("github.com/containernetworking/plugins")
    published = Published(
        kubernetes_version=version,
        coredns_version=coredns,
        cni_plugins_version=(cni or "").lstrip("v"),
        pause_tag=pause_tag(kubernetes),
        etcd_version=etcd_version,
        etcd_sha256=etcd_sha256,
        sha256=sha256,
        containerd_version=containerd_version,
        containerd_sha256=containerd_sha256,
        gpuinfra_image=image,
    )
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    _record(version).write_text(json.dumps(published.to_json(), indent=2) + "\n")
    return published


def publish_all(mirror: rootfs.Mirror) -> list[Published]:
    """Every Kubernetes version built on this machine (an upgrade needs the next one served
    too; `python -m lab.gobuild --all` builds it)."""
    return [publish(build, mirror) for build in gobuild.kubernetes_modules() if build.built]


def published(version: str | None = None) -> Published | None:
    """What publish recorded for a version, None before. By default the version a lab runs: the
    oldest go/ builds, so that `kubernetes upgrade` finds the next one served beside it."""
    if version is None:
        builds = gobuild.kubernetes_modules()
        if not builds:
            return None
        version = builds[0].requirement("k8s.io/kubernetes") or ""
    try:
        return Published(**json.loads(_record("v" + version.lstrip("v")).read_text()))
    except (OSError, ValueError, TypeError):
        return None  # none yet, or recorded by an older gpuinfra: the next `lab up` rewrites it


def upgrades() -> list[Published]:
    """The newer versions go/ builds that publish recorded: where a lab cluster may upgrade to."""
    newer = [
        published(build.requirement("k8s.io/kubernetes")) for build in gobuild.kubernetes_modules()
    ][1:]
    return [record for record in newer if record is not None]
