"""The wheel works on its own: built from the checkout's files, installed into a clean virtual
environment, it renders the sample inventory and finds its verification suites.

No network: the wheel is built without build isolation (setuptools from the running
environment), installed with --no-deps --no-index, and its dependencies are read from the
running environment's site-packages through a path file (a plain path entry: that folder's own
.pth files, the editable install of the checkout among them, are not processed). Slow (a build
and a virtual environment: well over 20 s on the shared machine), hence integration; it boots no
lab host.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def run(argv: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=900, **kwargs
    )


def checkout_copy(destination: Path) -> Path:
    """The files a fresh clone would hold (tracked, plus new files git does not ignore)."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], REPO)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o777)
    return destination


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(virtual environment, the checkout copy it was built from)."""
    work = tmp_path_factory.mktemp("wheel")
    source = checkout_copy(work / "src")
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", work / "dist", source],
        work,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("gpuinfra-*.whl")
    venv = work / "venv"
    made = run([sys.executable, "-m", "venv", venv], work)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work)
    deps = sysconfig.get_paths()["purelib"]  # the running environment's packages
    (Path(site.stdout.strip()) / "gpuinfra-test-deps.pth").write_text(deps + "\n")
    install = run([python, "-m", "pip", "install", "--no-deps", "--no-index", wheel], work)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv, source


def test_the_installed_package_is_the_wheel_not_the_checkout(installed) -> None:
    venv, _ = installed
    where = run(
        [venv / "bin" / "python", "-c",
         "import toolkit.assets as a, cli; print(a.__file__); print(a.TEMPLATES); "
         "print(a.VERIFY_SUITES)"],
        venv,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    module, templates, suites = where.stdout.split()
    for path in (module, templates, suites):
        assert path.startswith(str(venv)), where.stdout
    assert Path(templates, "base", "sshd.conf.j2").is_file()
    assert Path(suites, "base", "test_base.py").is_file()
    assert Path(suites, "probes.py").is_file()


def test_render_from_the_wheel(installed, tmp_path: Path) -> None:
    venv, source = installed
    out = tmp_path / "out"
    rendered = run([venv / "bin" / "gpuinfra", "render", source / "inventory" / "sample",
                    "--out", out], tmp_path)  # fmt: skip
    assert rendered.returncode == 0, rendered.stdout[-3000:] + rendered.stderr[-3000:]
    drop_in = out / "etcd-1" / "etc" / "ssh" / "sshd_config.d" / "50-gpuinfra.conf"
    assert "PasswordAuthentication no" in drop_in.read_text()
    assert any((out / "etcd-1").rglob("gpuinfra.nft"))


def test_verify_from_the_wheel_finds_its_suites(installed, tmp_path: Path) -> None:
    """`verify --help`, and a --roles value naming no suite: the error lists the suites the
    wheel carries (nothing connects: bad input is refused before any host is reached)."""
    venv, source = installed
    gpuinfra = venv / "bin" / "gpuinfra"
    helped = run([gpuinfra, "verify", "--help"], tmp_path)
    assert helped.returncode == 0 and "--roles" in helped.stdout, helped.stderr
    refused = run([gpuinfra, "verify", source / "inventory" / "sample", "--roles", "nosuch"],
                  tmp_path)  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = refused.stdout + refused.stderr
    assert "no verification suite for nosuch" in message
    assert "base" in message and "firewall" in message


def test_the_wheel_carries_the_gpu_health_agent(installed, tmp_path: Path) -> None:
    """The gpu-health pods run `python3 -m gpuhealth.gate` and the nodes `gpuinfra health run`
    from the image's wheel: the agent's package must be in it, not only in the checkout."""
    venv, _ = installed
    gate = run([venv / "bin" / "python", "-m", "gpuhealth.gate", "--help"], tmp_path)
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:]
    assert "python3 -m gpuhealth.gate" in gate.stdout
    where = run([venv / "bin" / "python", "-c", "import gpuhealth.node as n; print(n.__file__)"],
                tmp_path)  # fmt: skip
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    helped = run([venv / "bin" / "gpuinfra", "health", "run", "--help"], tmp_path)
    assert helped.returncode == 0 and "--expect-count" in helped.stdout, helped.stderr
