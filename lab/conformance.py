"""The Kubernetes conformance suite's images, built on this machine and pushed to the lab registry.

The suite (e2e.test, go/conformance-<minor>) pulls its images by the names and tags of its
image manifest (k8s.io/kubernetes test/utils/image/manifest.go), under registry.k8s.io's paths
(`e2e-test-images/agnhost:2.59`, `pause:3.10.1`, `etcd:3.6.6-0`). The lab registry serves them
under those same paths, so a lab host's containerd, which mirrors registry.k8s.io to it, pulls
them with or without `KUBE_TEST_REPO_LIST` (day2/conformance.py writes one for any registry).
Nothing comes from a public registry: the Go programs (agnhost, nonewprivs, sample-apiserver)
are built from their modules by lab/gobuild.py, and the rest from Debian packages through
debootstrap, keeping what the tests rely on (read from each image's Dockerfile under
test/images/ in the module source): the commands run inside, the files read, users, ports.

`python -m lab.conformance` builds the suite and publishes its images; it needs root (the
Debian roots) and the registry that `gpuinfra lab up` starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab import gobuild, offline, rootfs
from lab.errors import LabError

MANIFEST = "test/utils/image/manifest.go"
IMAGES_DIR = "test/images"
# The manifest's registries, by the RegistryList field each image names, as the paths the lab
# registry serves them under (registry.k8s.io's own paths, so its mirror finds them).
PATHS = {"PromoterE2eRegistry": "e2e-test-images", "GcRegistry": "", "GcEtcdRegistry": ""}
_CONFIG = re.compile(r'configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*"([^"]+)",\s*"([^"]+)"\}')

# agnhost's Dockerfile: Alpine with bind-tools, curl, netcat-openbsd, iproute2, iperf and bash
# (its subcommands and the tests' `sh -c` lines call them); Debian's names for the same tools.
AGNHOST_PACKAGES = ("bind9-dnsutils", "curl", "netcat-openbsd", "iproute2", "iperf", "bash")
# The Dockerfile's `adduser -u 1000 user-defined-in-image`, in `group-defined-in-image` (50000):
# the supplemental-groups tests read them from the image's /etc/group.
AGNHOST_SETUP = (
    ("groupadd", "-g", "50000", "group-defined-in-image"),
    ("useradd", "-u", "1000", "-M", "-G", "group-defined-in-image", "user-defined-in-image"),
)
# busybox: a static busybox built here from the release's own source, its every applet linked
# where Debian's minimal root has no command of that name (a command the tests run, `wget`,
# `nslookup`, `nc`, `top`, exists either way; busybox does not replace a file). Not Debian's
# busybox-static: Debian reverts upstream's commit 9c143ce5 (debian/patches/revert-9c143ce5...),
# so its ash drops every environment variable whose name is not a shell identifier, and the
# Secret and ConfigMap tests' `sh -c env` must print `data-1=value-1`. Its source is the
# release tarball as Debian's archive ships it (`.orig`, checked against the sha256 here).
BUSYBOX_SOURCE = (
    "pool/main/b/busybox/busybox_1.37.0.orig.tar.bz2",
    "3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4",
)
# Upstream's defconfig, as upstream's image, linked statically; without tc, whose CBQ code does
# not build against Linux 6.8's headers and later (no test runs tc).
BUSYBOX_CONFIG = {"CONFIG_STATIC": "y", "CONFIG_TC": None}
BUSYBOX_DIR = Path("/var/cache/gpuinfra/busybox")
# `--install -s` puts each applet where busybox files it (sysctl in /sbin, which Debian's
# merged /usr keeps apart from /bin); the tests run some by their /bin path (`/bin/sysctl` in
# the sysctl test), as upstream's image has every applet there: each is linked in /bin too.
BUSYBOX_SETUP = (
    ("/bin/busybox", "--install", "-s"),
    (
        "/bin/busybox", "sh", "-c",
        "for a in $(/bin/busybox --list); do [ -e /bin/$a ] || /bin/busybox ln -s busybox /bin/$a;"
        " done",
    ),
    # The tests match the messages of busybox's own shell ("/bin/sh: can't create /file:
    # Read-only file system"), not dash's, which Debian links as /bin/sh.
    ("/bin/busybox", "ln", "-sf", "busybox", "/bin/sh"),
)  # fmt: skip
# nginx: upstream's image serves its page on port 80 with its logs on the container's output,
# and listens on IPv6 only where the pod has it (Debian's site would fail to start without).
NGINX_PACKAGES = ("nginx",)
NGINX_SETUP = (
    ("sed", "-i", r"/listen \[::\]:80/d", "/etc/nginx/sites-available/default"),
    ("ln", "-sf", "/dev/stdout", "/var/log/nginx/access.log"),
    ("ln", "-sf", "/dev/stderr", "/var/log/nginx/error.log"),
)
NGINX_CMD = ("nginx", "-g", "daemon off;")
# jessie-dnsutils: dig, nslookup and host for the DNS tests' probe loops.
DNSUTILS_PACKAGES = ("bind9-dnsutils",)


@dataclass(frozen=True)
class ManifestImage:
    """One image of the suite's manifest: its ImageID, registry field, name and tag."""

    image_id: str
    registry: str
    name: str
    tag: str

    @property
    def repository(self) -> str:
        """The name under the lab registry (registry.k8s.io's path)."""
        prefix = PATHS.get(self.registry)
        if prefix is None:
            raise LabError(f"{self.image_id}: no lab registry path for {self.registry}")
        return f"{prefix}/{self.name}" if prefix else self.name


def manifest_images(manifest_go: str) -> dict[str, ManifestImage]:
    """The manifest's images by ImageID, read from manifest.go's `configs[...] = Config{...}`."""
    return {
        match.group(1): ManifestImage(*match.groups()) for match in _CONFIG.finditer(manifest_go)
    }


def module_source(suite: gobuild.GoModule) -> Path:
    """k8s.io/kubernetes's source in the module cache, as go/conformance-<minor> pins it."""
    go = shutil.which("go")
    if go is None:
        raise LabError("go is not installed: the suite's images are built from its modules")
    result = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
        cwd=suite.path,
        env={**os.environ, **gobuild.GO_ENV},
        capture_output=True,
        text=True,
    )
    folder = Path(result.stdout.strip())
    if result.returncode != 0 or not (folder / MANIFEST).is_file():
        raise LabError(f"k8s.io/kubernetes's source is not in the module cache: {result.stderr}")
    return folder


# ---------------------------------------------------------------- the images


@dataclass(frozen=True)
class Built:
    """An image ready to push: its layers, entrypoint, default arguments, and what made it."""

    layers: list[Path]
    entrypoint: str | None
    cmd: tuple[str, ...]
    label: str


def _label(layers: list[Path], *more: str) -> str:
    digest = hashlib.sha256()
    for part in [*(layer.name for layer in layers), *more]:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _base(name: str, packages, mirror, setup=(), files=None) -> Path:
    return offline._debian_base(
        f"e2e-{name}", tuple(packages), mirror, setup=tuple(setup), files=files
    )


def busybox_binary(mirror: rootfs.Mirror) -> Path:
    """A static busybox of BUSYBOX_SOURCE with BUSYBOX_CONFIG, built once per machine (about a
    CPU-minute) with this machine's C compiler."""
    path, sha256 = BUSYBOX_SOURCE
    made = BUSYBOX_DIR / f"{Path(path).name.split('.orig')[0]}-{sha256[:12]}" / "busybox"
    if made.is_file():
        return made
    missing = [tool for tool in ("make", "cc", "bzip2") if shutil.which(tool) is None]
    if missing:
        raise LabError(
            f"building busybox needs {', '.join(missing)}: run scripts/install-debian-packages.sh"
        )
    BUSYBOX_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".busybox-", dir=BUSYBOX_DIR) as work:
        tarball = Path(work) / Path(path).name
        url = f"{mirror.archive}/{path}"
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                tarball.write_bytes(response.read())
        except OSError as exc:
            raise LabError(f"busybox's source could not be fetched from {url}: {exc}") from exc
        got = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if got != sha256:
            raise LabError(f"{url} has sha256 {got}, not the {sha256} lab/conformance.py pins")
        _run_build(["tar", "-xjf", tarball.name], Path(work))
        (source,) = [entry for entry in Path(work).iterdir() if entry.is_dir()]
        _run_build(["make", "defconfig"], source)
        config = source / ".config"
        config.write_text(busybox_config(config.read_text(), BUSYBOX_CONFIG))
        _run_build(["make", f"-j{os.cpu_count() or 1}", "busybox"], source)
        made.parent.mkdir(exist_ok=True)
        staged = made.with_name(".busybox.new")
        shutil.copy2(source / "busybox", staged)
        staged.replace(made)
    return made


def busybox_config(config: str, settings: dict[str, str | None]) -> str:
    """A Kconfig `.config` with each setting given a value, or turned off for None."""
    lines = [
        line
        for line in config.splitlines()
        if not any(re.match(rf"(# )?{name}[= ]", line) for name in settings)
    ]
    for name, value in settings.items():
        lines.append(f"{name}={value}" if value is not None else f"# {name} is not set")
    return "\n".join(lines) + "\n"


def _run_build(argv: list[str], cwd: Path) -> None:
    ran = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if ran.returncode != 0:
        tail = (ran.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"building busybox: {' '.join(argv)} failed: {tail}")


def _agnhost(suite: gobuild.GoModule, source: Path, mirror: rootfs.Mirror) -> list[Path]:
    """agnhost's layers: the Debian tools, then /agnhost with what its subcommands read."""
    porter = source / IMAGES_DIR / "agnhost/porter"
    tools = gobuild.module("cluster-tools")

    def fill(root: Path) -> None:
        # The layer's "./" is the container's /: a temporary folder's 0700 would shut out
        # every test that runs as another user.
        root.chmod(0o755)
        shutil.copy2(suite.binary("agnhost"), root / "agnhost")
        (root / "agnhost-2").symlink_to("agnhost")  # entrypoint-tester calls itself by it
        for name in ("localhost.crt", "localhost.key"):  # porter's and netexec's TLS
            shutil.copyfile(porter / name, root / name)
        shutil.copy2(tools.binary("coredns"), root / "coredns")
        (root / "uploads").mkdir()  # netexec's /upload writes here

    program, _ = offline._tree_layer("e2e-agnhost", fill)
    return [_base("agnhost", AGNHOST_PACKAGES, mirror, AGNHOST_SETUP), program]


def build_images(
    suite: gobuild.GoModule, source: Path, mirror: rootfs.Mirror
) -> dict[str, Callable[[ManifestImage], Built]]:
    """How each ImageID this lab builds is made; the manifest's others are not built."""

    def agnhost(image: ManifestImage) -> Built:
        layers = _agnhost(suite, source, mirror)
        # One build under two tags; the tag in the label gives each its own digest, as the
        # tests that move a workload from one agnhost to the other expect.
        return Built(layers, "/agnhost", ("pause",), _label(layers, image.tag))

    def nautilus(image: ManifestImage) -> Built:
        html = source / IMAGES_DIR / "nautilus/html"
        pictures, _ = offline._layer_file(
            "e2e-nautilus",
            {"nautilus.jpg": html / "nautilus.jpg", "data.json": html / "data.json"},
            mode=0o644,
        )
        layers = [*_agnhost(suite, source, mirror), pictures]
        return Built(layers, "/agnhost", ("test-webserver",), _label(layers))

    def busybox(image: ManifestImage) -> Built:
        files = {"usr/bin/busybox": busybox_binary(mirror)}
        layers = [_base("busybox", (), mirror, BUSYBOX_SETUP, files)]
        return Built(layers, None, ("sh",), _label(layers))

    def nginx(image: ManifestImage) -> Built:
        layers = [_base("nginx", NGINX_PACKAGES, mirror, NGINX_SETUP)]
        return Built(layers, None, NGINX_CMD, _label(layers, image.tag))

    def dnsutils(image: ManifestImage) -> Built:
        coredns, _ = offline._layer_file(
            "e2e-coredns", {"coredns": gobuild.module("cluster-tools").binary("coredns")}
        )
        layers = [_base("dnsutils", DNSUTILS_PACKAGES, mirror), coredns]
        return Built(layers, None, ("bash",), _label(layers))

    def program(name: str, path: str, entrypoint: str | None, cmd=(), mode=0o755):
        def made(image: ManifestImage) -> Built:
            layer, _ = offline._layer_file(f"e2e-{name}", {path: suite.binary(name)}, mode)
            return Built([layer], entrypoint, tuple(cmd), _label([layer]))

        return made

    def pause(image: ManifestImage) -> Built:
        # The same layer and label as the cluster's own pause image (offline.publish_images).
        pause = gobuild.module("pause").binary("pause")
        layer, digest = offline._layer_file("pause", {"pause": pause})
        return Built([layer], "/pause", (), digest)

    def etcd(image: ManifestImage) -> Built:
        # The aggregator test runs /usr/local/bin/etcd beside the sample API server.
        layer, _ = offline._layer_file(
            "e2e-etcd", {"usr/local/bin/etcd": gobuild.module("etcd-3.6").binary("server")}
        )
        return Built([layer], None, ("/usr/local/bin/etcd",), _label([layer]))

    return {
        "Agnhost": agnhost,
        "AgnhostPrev": agnhost,
        "Nautilus": nautilus,
        "BusyBox": busybox,
        "Nginx": nginx,
        "NginxNew": nginx,
        "JessieDnsutils": dnsutils,
        "APIServer": program("sample-apiserver", "sample-apiserver", "/sample-apiserver"),
        # Set-user-ID root, as the Dockerfile's `chmod +s`: the test checks it is not honoured.
        "Nonewprivs": program("nonewprivs", "usr/local/bin/nnp", None, ("nnp",), 0o4755),
        "Pause": pause,
        "Etcd": etcd,
    }


BUILT_HERE = (
    "Agnhost", "AgnhostPrev", "Nautilus", "BusyBox", "Nginx", "NginxNew", "JessieDnsutils",
    "APIServer", "Nonewprivs", "Pause", "Etcd",
)  # fmt: skip


@dataclass
class Publication:
    """What publish pushed, by `name:tag`, and the manifest's images it does not build."""

    pushed: list[str]
    not_built: list[str]


def publish(suite: gobuild.GoModule, mirror: rootfs.Mirror, log=sys.stderr) -> Publication:
    """Push every image of BUILT_HERE under the manifest's name and tag (idempotent)."""
    source = module_source(suite)
    images = manifest_images((source / MANIFEST).read_text())
    makers = build_images(suite, source, mirror)
    pushed = []
    for image_id in BUILT_HERE:
        image = images.get(image_id)
        if image is None:
            raise LabError(f"the suite's manifest ({MANIFEST}) has no {image_id} any more")
        built = makers[image_id](image)
        offline._push_image(
            image.repository, image.tag, built.layers, built.entrypoint,
            label=built.label, cmd=built.cmd,
        )  # fmt: skip
        pushed.append(f"{image.repository}:{image.tag}")
        print(f"pushed {image.repository}:{image.tag}", file=log, flush=True)
    not_built = sorted(set(images) - set(BUILT_HERE))
    return Publication(pushed, not_built)


def main(argv: list[str] | None = None) -> int:
    """`python -m lab.conformance`: build go/conformance-<minor> of the lab's Kubernetes and
    publish its images to the lab registry; prints e2e.test's path."""
    from lab.state import machine_locked
    from lab.system import require_root_and_tools

    args = sys.argv[1:] if argv is None else argv
    try:
        if args:
            raise LabError(f"no arguments expected, got {' '.join(args)}")
        require_root_and_tools()
        version = gobuild.kubernetes_modules()[0].requirement("k8s.io/kubernetes") or ""
        suite = gobuild.conformance_module(version)
        gobuild.build(suite)
        with machine_locked():
            offline.ensure_running()
            publication = publish(suite, rootfs.machine_mirror())
        print(f"not built here: {', '.join(publication.not_built)}", file=sys.stderr)
        print(suite.binary("e2e.test"))
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
