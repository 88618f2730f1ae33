"""Faults injected into applies of every role on lab hosts, and what survives them.

Run by `make test-long`, by hand, not in CI (about 14 minutes; `make test`
deselects it by the `faults` marker): `.venv/bin/pytest -m faults tests/integration/test_faults.py`
alone. Each test writes its counts to build/faults/<test>.json; docs/reliability.md holds the
figures.

The lab is `faults` (GPUINFRA_FAULTS_LAB overrides it), five Debian 13 hosts covering every role
but the GPU ones: base, kernel, container_runtime (cp-1, cpu-1), firewall, dns and monitoring
(dns-1), loadbalancer (lb-1), etcd with one member on its own disk (etcd-1, client certs on
cp-1). Every test starts from bare hosts (the lab is taken down and booted again: seconds).

- SIGKILL of the controller: `gpuinfra apply` runs in its own process group and is killed
  (SIGKILL to the group) when the N-th host x operation has finished, N spread from 1 % to 88 %
  of the run (it reports its progress to the file named by GPUINFRA_PROGRESS_FILE, a hook for
  tests). The kills are chained: the apply after kill k is the run killed at point k+1, and it
  starts from what kill k left; the apply after the last kill runs to its end. After each kill,
  every managed file on every host is checked: it must be the content it had before that run,
  the content `gpuinfra render` writes for that host, or (for a package's conffile, written by
  an install the run started) the package's own content as dpkg records it; absent only if it
  was absent before; a file that matches none is counted, and called half-written when it is a
  strict prefix of the old or the new content. A secret (mode 0600 in the render) must never
  be readable by others. After the final apply, `gpuinfra drift` must exit 0 and no staged
  `.<name>.gpuinfra-new` file may be left.
- A host rebooted (`systemctl reboot` inside it: the lab's supervisor boots it again, as a
  real machine comes back), a host partitioned (`gpuinfra lab partition`: its only link goes
  down, it keeps running) and a host whose disk fills up (a full tmpfs mounted, from the
  machine, into the host's mount namespace over a directory a later role writes: the
  filesystem under that path has no space left, everything else works; filling the host's
  real root would fill the machine's own disk, which the lab shares), each while an apply
  works on it: the other hosts finish, the report names the host and the cause, the exit
  code is 1 (an operation failed) or 4 (unreachable), and once the fault is gone a later apply
  converges the host (drift exit 0).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.engine import PROGRESS_FILE_ENV
from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.host import HostPaths, nspawn_pid
from lab.state import read_state
from lab.topology import HostSpec, Topology
from tests.integration.conftest import KEEP_ENV, LabCluster, boot_lab
from tests.integration.roles_helpers import GPUINFRA, gpuinfra
from toolkit.ssh import ssh_argv

pytestmark = [pytest.mark.integration, pytest.mark.faults]

FAULTS_LAB = os.environ.get("GPUINFRA_FAULTS_LAB", "faults")
TOPOLOGY = Topology(
    (
        HostSpec("etcd-1", ("etcd",), disk_bytes=2**30),
        HostSpec("cp-1", ("control_plane",)),
        HostSpec("lb-1", ("loadbalancer",)),
        HostSpec("dns-1", ("dns", "monitoring")),
        HostSpec("cpu-1", ("cpu_worker",)),
    ),
    "faults",
)
# Where the kills land, as shares of the run's host x operations.
KILL_POINTS = (0.01, 0.05, 0.12, 0.20, 0.30, 0.40, 0.50, 0.62, 0.75, 0.88)
RESULTS = Path(__file__).resolve().parents[2] / "build" / "faults"
# A guard against a run that never ends (a hang is a finding, reported as such), not a timing.
RUN_GUARD_S = float(os.environ.get("GPUINFRA_FAULTS_GUARD_S", "1500"))


@pytest.fixture(scope="module")
def lab_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inventory = tmp_path_factory.mktemp("faults") / "cluster.yml"
    yield inventory
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(FAULTS_LAB)


def bare_lab(inventory: Path) -> LabCluster:
    """The lab with every host as debootstrap left it (its cluster state, .state/, is kept)."""
    if read_state(FAULTS_LAB) is not None:
        lifecycle.down(FAULTS_LAB)
    return boot_lab(FAULTS_LAB, TOPOLOGY, inventory)


# --- runs ------------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int | None  # None: killed
    done: int  # host x operations finished when it ended
    total: int
    seconds: float
    report: dict | None = None
    output: str = ""


def apply(
    lab: LabCluster,
    workdir: Path,
    label: str,
    *,
    when: Callable[[int, int], bool] | None = None,
    act: Callable[[subprocess.Popen], None] | None = None,
) -> Run:
    """Run `gpuinfra apply` of every role; once `when(done, total)` holds, call `act` (default:
    SIGKILL the apply's process group) and go on watching. Returns when the apply ended."""
    progress = workdir / f"{label}.progress"
    report = workdir / f"{label}.json"
    output = workdir / f"{label}.out"
    env = dict(os.environ, **{PROGRESS_FILE_ENV: str(progress)})
    argv = [GPUINFRA, "apply", str(lab.inventory_path), "--yes", "--report", str(report)]
    started = time.monotonic()
    with output.open("w") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
        fired = False
        while process.poll() is None:
            done, total = last_progress(progress)
            if when is not None and not fired and total and when(done, total):
                fired = True
                (act or kill_group)(process)
            if time.monotonic() - started > RUN_GUARD_S:
                kill_group(process)
                raise AssertionError(f"{label}: apply still running after {RUN_GUARD_S} s")
            time.sleep(0.1)
    done, total = last_progress(progress)
    killed = process.returncode == -signal.SIGKILL
    return Run(
        returncode=None if killed else process.returncode,
        done=done,
        total=total,
        seconds=time.monotonic() - started,
        report=json.loads(report.read_text()) if report.exists() else None,
        output=output.read_text()[-3000:],
    )


def kill_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def last_progress(path: Path) -> tuple[int, int]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0, 0
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    return 0, 0


def drift(lab: LabCluster, workdir: Path, label: str) -> tuple[int, dict]:
    report = workdir / f"{label}.json"
    result = gpuinfra("drift", str(lab.inventory_path), "--report", str(report))
    return result.returncode, json.loads(report.read_text()) if report.exists() else {}


# --- what is on the hosts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    content: bytes
    mode: int


def render(lab: LabCluster, out: Path) -> dict[str, dict[str, Rendered]]:
    """host -> path -> what `gpuinfra render` writes for it (content and mode)."""
    result = gpuinfra("render", str(lab.inventory_path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    rendered: dict[str, dict[str, Rendered]] = {}
    for host in lab.hosts:
        root = out / host
        rendered[host] = {
            "/" + str(f.relative_to(root)): Rendered(f.read_bytes(), f.stat().st_mode & 0o777)
            for f in sorted(root.rglob("*"))
            if f.is_file()
        }
    return rendered


# Runs on a host: for each managed path its sha256 and mode (or null), the base64 content of
# those not in the given set of known digests, staged files beside them, dpkg's conffile md5s
# and what is still running from a controller that went away.
PROBE = r"""
import base64, glob, hashlib, json, os, subprocess, sys
wanted = json.load(sys.stdin)
files, staged = {}, []
for path, known in wanted.items():
    try:
        data = open(path, "rb").read()
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        files[path] = None
        continue
    digest = hashlib.sha256(data).hexdigest()
    entry = {"sha256": digest, "md5": hashlib.md5(data).hexdigest(), "mode": mode}
    if digest not in known:
        entry["content"] = base64.b64encode(data).decode()
    files[path] = entry
for directory in sorted({os.path.dirname(p) for p in wanted}):
    staged += glob.glob(os.path.join(directory, ".*.gpuinfra-new"))
conffiles = {}
out = subprocess.run(["dpkg-query", "-W", "-f", "${Conffiles}\n"], capture_output=True, text=True)
for line in out.stdout.splitlines():
    parts = line.split()
    if len(parts) >= 2 and parts[0] in wanted:
        conffiles.setdefault(parts[0], []).append(parts[1])
busy = subprocess.run(["pgrep", "-a", "-f", "apt-get|dpkg|sftp-server"], capture_output=True,
                      text=True).stdout.splitlines()
busy = [line for line in busy if "pgrep" not in line]
print(json.dumps({"files": files, "staged": staged, "conffiles": conffiles, "busy": busy}))
"""


def probe(lab: LabCluster, host: str, known: dict[str, list[str]]) -> dict:
    encoded = base64.b64encode(PROBE.encode()).decode()
    command = f"python3 -c 'import base64; exec(base64.b64decode(\"{encoded}\"))'"
    argv = ssh_argv(lab.loaded, host) + [command]
    result = subprocess.run(
        argv, input=json.dumps(known), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{host}: probe failed: {result.stderr}"
    return json.loads(result.stdout)


def snapshot(lab: LabCluster, rendered: dict[str, dict[str, Rendered]]) -> dict[str, dict]:
    """host -> path -> {sha256, content} or None: the managed files as they are now."""
    taken = {}
    for host, files in rendered.items():
        found = probe(lab, host, {path: [] for path in files})["files"]
        taken[host] = {
            path: None
            if entry is None
            else {"sha256": entry["sha256"], "content": base64.b64decode(entry["content"])}
            for path, entry in found.items()
        }
    return taken


@dataclass
class FileCheck:
    checked: int = 0
    new: int = 0
    old: int = 0
    absent: int = 0
    package: int = 0  # a package's own conffile content, from an install the run started
    half_written: list[str] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    exposed_secrets: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    busy: dict[str, list[str]] = field(default_factory=dict)

    @property
    def bad(self) -> list[str]:
        return self.half_written + self.unexplained + self.exposed_secrets


def check_files(lab: LabCluster, rendered, before) -> FileCheck:
    """Every managed file is whole: old, new, a package's own, or absent if it was absent."""
    check = FileCheck()
    for host, files in rendered.items():
        known = {path: [sha(want.content)] for path, want in files.items()}
        for path, old in before[host].items():
            if old is not None:
                known[path].append(old["sha256"])
        found = probe(lab, host, known)
        check.staged += [f"{host}:{path}" for path in found["staged"]]
        if found["busy"]:
            check.busy[host] = found["busy"]
        for path, entry in found["files"].items():
            check.checked += 1
            want, old = files[path], before[host][path]
            where = f"{host}:{path}"
            if entry is None:
                check.absent += 1
                if old is not None:
                    check.unexplained.append(f"{where}: gone (it existed before the run)")
                continue
            if entry["sha256"] == sha(want.content):
                check.new += 1
                # A secret (0600 in the render, which writes every secret 0600 on the
                # controller) is never readable by others on the host; its group may read it
                # where the role says so (bind reads the TSIG key: 0640 root:bind).
                if want.mode & 0o077 == 0 and entry["mode"] & 0o007:
                    check.exposed_secrets.append(f"{where}: mode {entry['mode']:o}")
                continue
            if old is not None and entry["sha256"] == old["sha256"]:
                check.old += 1
                continue
            if entry["md5"] in found["conffiles"].get(path, []):
                check.package += 1
                continue
            content = base64.b64decode(entry["content"])
            prefixes = [want.content] + ([old["content"]] if old else [])
            if any(len(content) < len(whole) and whole.startswith(content) for whole in prefixes):
                check.half_written.append(f"{where}: {len(content)} bytes, a prefix")
            else:
                check.unexplained.append(f"{where}: {len(content)} bytes, {content[:80]!r}")
    return check


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def staged_files(lab: LabCluster, rendered) -> list[str]:
    left = []
    for host, files in rendered.items():
        left += [f"{host}:{p}" for p in probe(lab, host, {p: [] for p in files})["staged"]]
    return left


def wait_quiet(lab: LabCluster, rendered, deadline_s: float = 300) -> float:
    """Wait until no apt, dpkg or sftp-server started by the dead controller runs on any host;
    returns how long that took."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if not any(probe(lab, host, {})["busy"] for host in rendered):
            break
        time.sleep(1)
    return time.monotonic() - started


def save(name: str, data: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))


# --- SIGKILL of the controller -------------------------------------------------------------


def test_sigkill_of_the_controller_leaves_whole_files_and_the_next_apply_converges(
    lab_inventory: Path, tmp_path: Path
) -> None:
    lab = bare_lab(lab_inventory)
    rendered = render(lab, tmp_path / "render")
    kills = []
    problems = []
    for number, share in enumerate(KILL_POINTS, 1):
        before = snapshot(lab, rendered)
        run = apply(
            lab, tmp_path, f"kill-{number}", when=lambda done, total, s=share: done >= s * total
        )
        if run.returncode is not None:  # the run ended before its kill point: nothing left
            kills.append({"point": share, "killed": False, "returncode": run.returncode})
            continue
        # Rendered again: generated secrets are placeholders until an apply made the state
        # (render never writes it), and the first killed apply has made it by now.
        rendered = render(lab, tmp_path / f"render-{number}")
        check = check_files(lab, rendered, before)
        quiet_s = wait_quiet(lab, rendered)
        kills.append(
            {
                "point": share,
                "killed": True,
                "done": run.done,
                "total": run.total,
                "seconds": round(run.seconds, 1),
                "files_checked": check.checked,
                "new": check.new,
                "old": check.old,
                "absent": check.absent,
                "package": check.package,
                "half_written": check.half_written,
                "unexplained": check.unexplained,
                "exposed_secrets": check.exposed_secrets,
                "staged_left": check.staged,
                "still_running_after_kill": check.busy,
                "quiet_after_s": round(quiet_s, 1),
            }
        )
        problems += [f"kill {number} ({share:.0%}): {bad}" for bad in check.bad]
        save("sigkill", {"kills": kills})

    final = apply(lab, tmp_path, "converge")
    drift_code, drift_report = drift(lab, tmp_path, "drift")
    left = staged_files(lab, rendered)
    summary = {
        "kills": kills,
        "kills_injected": sum(k["killed"] for k in kills),
        "files_checked": sum(k.get("files_checked", 0) for k in kills),
        "half_written": sum(len(k.get("half_written", [])) for k in kills),
        "unexplained": sum(len(k.get("unexplained", [])) for k in kills),
        "final_apply": {
            "returncode": final.returncode,
            "seconds": round(final.seconds, 1),
            "hosts": {n: h["status"] for n, h in (final.report or {}).get("hosts", {}).items()},
        },
        "drift_exit": drift_code,
        "staged_left_after_converge": left,
    }
    save("sigkill", summary)
    assert summary["kills_injected"] >= 10, kills
    assert problems == [], problems
    assert final.returncode == ExitCode.OK, final.output
    assert drift_code == ExitCode.OK, {
        n: [op["name"] for op in h["operations"] if op["changed"]] or h.get("error")
        for n, h in drift_report.get("hosts", {}).items()
        if h["status"] != "ok"
    }
    assert left == []


# --- a host lost or broken in the middle of an apply ---------------------------------------


@dataclass(frozen=True)
class HostFault:
    name: str
    host: str
    share: float  # when to inject it, as a share of the run's host x operations
    inject: Callable[[LabCluster], None]
    clear: Callable[[LabCluster], None]
    expected_exit: tuple[int, ...]
    cause: tuple[str, ...]  # the report's error for the host names one of these


def reboot(lab: LabCluster, host: str) -> None:
    # The command's own connection may drop before it answers: its exit status says nothing.
    lab.ssh(host, "systemctl reboot", check=False, timeout=30)


def partition(lab: LabCluster, host: str, cut: bool) -> None:
    command = "partition" if cut else "heal"
    subprocess.run([GPUINFRA, "lab", command, host, "--name", lab.name], check=True)


FULL_DIR = "/etc/prometheus"  # written by monitoring, the last role, on dns-1


def fill_disk(lab: LabCluster, host: str) -> None:
    """Mount a 1 MiB tmpfs over FULL_DIR inside the host, holding what was there and a file
    filling the rest: any write under FULL_DIR then fails with ENOSPC."""
    pid = container_init(lab, host)
    script = (
        f"mkdir -p {FULL_DIR} && tar -C {FULL_DIR} -cf /tmp/gpuinfra-full.tar . && "
        f"mount -t tmpfs -o size=1m gpuinfra-full {FULL_DIR} && "
        f"tar -C {FULL_DIR} -xf /tmp/gpuinfra-full.tar && "
        f"(dd if=/dev/zero of={FULL_DIR}/.filler bs=4k 2>/dev/null; true)"
    )
    subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "sh", "-c", script], check=True)


def free_disk(lab: LabCluster, host: str) -> None:
    """What an operator does: free the space (here: the full filesystem goes, and with it what
    was written under it, so the apply writes it again)."""
    pid = container_init(lab, host)
    subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "umount", FULL_DIR], check=True)


def container_init(lab: LabCluster, host: str) -> int:
    """The pid (on the machine) of the host's init, whose mount namespace is the host's."""
    state = read_state(lab.name)
    assert state is not None
    nspawn = nspawn_pid(HostPaths(state.names.host_dir(host)))
    assert nspawn is not None, f"{host} is not running"
    children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    assert children, f"{host}: systemd-nspawn has no child"
    return int(children[0])


CONNECTION_LOST = ("connection lost", "unreachable", "timed out", "closed")
FAULTS = {
    "reboot": HostFault(
        "reboot",
        "cpu-1",
        0.25,
        lambda lab: reboot(lab, "cpu-1"),
        lambda lab: None,
        (ExitCode.ERROR, ExitCode.UNREACHABLE),
        CONNECTION_LOST,
    ),
    "partition": HostFault(
        "partition",
        "lb-1",
        0.25,
        lambda lab: partition(lab, "lb-1", True),
        lambda lab: partition(lab, "lb-1", False),
        (ExitCode.ERROR, ExitCode.UNREACHABLE),
        CONNECTION_LOST,
    ),
    "disk_full": HostFault(
        "disk_full",
        "dns-1",
        0.25,
        lambda lab: fill_disk(lab, "dns-1"),
        lambda lab: free_disk(lab, "dns-1"),
        (ExitCode.ERROR,),
        ("no space left",),
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_host_fault_mid_apply_is_reported_and_a_later_apply_converges(
    fault: str, lab_inventory: Path, tmp_path: Path
) -> None:
    spec = FAULTS[fault]
    lab = bare_lab(lab_inventory)
    injected: list[tuple[int, int]] = []

    def inject(process: subprocess.Popen) -> None:
        injected.append(last_progress(tmp_path / "faulted.progress"))
        spec.inject(lab)

    try:
        run = apply(lab, tmp_path, "faulted", when=lambda d, t: d >= spec.share * t, act=inject)
    finally:
        spec.clear(lab)
    assert injected, f"the apply ended before the fault was injected: {run.output}"
    hosts = (run.report or {}).get("hosts", {})
    faulted = hosts.get(spec.host, {})
    others = {n: h["status"] for n, h in hosts.items() if n != spec.host}
    converge = apply(lab, tmp_path, "converge")
    drift_code, drift_report = drift(lab, tmp_path, "drift")
    save(
        f"host-{fault}",
        {
            "fault": fault,
            "host": spec.host,
            "injected_at": injected,
            "returncode": run.returncode,
            "seconds": round(run.seconds, 1),
            "faulted_status": faulted.get("status"),
            "faulted_error": faulted.get("error"),
            "others": others,
            "converge_returncode": converge.returncode,
            "converge_hosts": {
                n: h["status"] for n, h in (converge.report or {}).get("hosts", {}).items()
            },
            "drift_exit": drift_code,
        },
    )
    assert run.report is not None, run.output
    assert run.returncode in spec.expected_exit, run.output
    assert faulted.get("status") in ("failed", "unreachable"), faulted
    assert any(word in (faulted.get("error") or "").lower() for word in spec.cause), faulted
    assert others and set(others.values()) <= {"changed", "ok"}, others
    assert converge.returncode == ExitCode.OK, converge.output
    assert drift_code == ExitCode.OK, drift_report.get("hosts", {}).get(spec.host)
