"""Run the testinfra verification suites (tests/verify/<role>/) against a cluster's hosts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# tempfile, xml.etree and concurrent.futures (which loads logging) are imported where they are
# used: `gpuinfra --help` imports this module for its defaults and must stay quick.
from toolkit import assets

SUITES = assets.VERIFY_SUITES
# Each pytest process checks its share of the hosts one test at a time; SSH round trips, not
# the controller's CPU, are what a run waits on, so a few processes in parallel cut the wall time.
DEFAULT_PROCESSES = 6


@dataclass
class VerifyResult:
    role: str
    host: str
    test: str
    outcome: str  # passed, failed, error (setup failed, e.g. host unreachable), skipped
    message: str = ""
    seconds: float = 0.0


@dataclass
class VerifyReport:
    results: list[VerifyResult] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # output of pytest runs that could not run

    def counts(self) -> Counter[str]:
        return Counter(result.outcome for result in self.results)

    def failures(self) -> list[VerifyResult]:
        return [r for r in self.results if r.outcome in ("failed", "error")]

    def unreachable_hosts(self) -> list[str]:
        """Hosts whose every test errored before running: SSH never got through."""
        by_host: dict[str, set[str]] = {}
        for result in self.results:
            by_host.setdefault(result.host, set()).add(result.outcome)
        return sorted(host for host, outcomes in by_host.items() if outcomes == {"error"})


def available_suites() -> list[str]:
    return sorted(p.name for p in SUITES.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def verify(
    inventory: Path,
    hosts: list[str],
    roles: tuple[str, ...] = (),
    junit: Path | None = None,
    processes: int = DEFAULT_PROCESSES,
) -> VerifyReport:
    """Run the suites for `hosts` in pytest subprocesses (the CLI process is gevent-patched for
    pyinfra; pytest runs tests one by one), hosts spread round-robin over the processes, and
    collect one result per test, host and item."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    shards = [hosts[index::processes] for index in range(min(processes, len(hosts)))]
    report = VerifyReport()
    with tempfile.TemporaryDirectory(prefix="gpuinfra-verify-") as scratch:

        def run_shard(index: int) -> tuple[list[dict], int, str]:
            results_path = Path(scratch) / f"results-{index}.json"
            argv = [
                sys.executable, "-m", "pytest", str(SUITES),
                "-p", "no:cacheprovider", "-q", "--no-header", "-o", "addopts=",
                f"--rootdir={SUITES.parents[1]}",
                f"--gpuinfra-inventory={inventory.resolve()}",
                f"--gpuinfra-roles={','.join(roles)}",
                f"--gpuinfra-hosts={','.join(shards[index])}",
                f"--gpuinfra-results={results_path}",
            ]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, cwd=SUITES.parents[1])
            records = json.loads(results_path.read_text()) if results_path.exists() else []
            return records, done.returncode, done.stdout + done.stderr

        with ThreadPoolExecutor(max_workers=max(1, len(shards))) as pool:
            for records, returncode, output in pool.map(run_shard, range(len(shards))):
                report.results += [VerifyResult(**record) for record in records]
                # pytest: 0 passed, 1 tests failed, 5 nothing collected; others: it broke.
                if returncode not in (0, 1, 5):
                    report.broken.append(output.strip())
    order = {name: index for index, name in enumerate(hosts)}
    report.results.sort(key=lambda r: (r.role, order.get(r.host, len(order))))
    if junit is not None:
        write_junit(report, junit)
    return report


def write_junit(report: VerifyReport, path: Path) -> None:
    """One test suite per role, one test case per check and host (classname: role.host)."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="gpuinfra verify")
    for role in sorted({r.role for r in report.results}):
        results = [r for r in report.results if r.role == role]
        suite = ET.SubElement(root, "testsuite", name=role, tests=str(len(results)))
        counts = Counter(r.outcome for r in results)
        suite.set("failures", str(counts.get("failed", 0)))
        suite.set("errors", str(counts.get("error", 0)))
        suite.set("skipped", str(counts.get("skipped", 0)))
        for result in results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{role}.{result.host}",
                name=result.test,
                time=f"{result.seconds:.3f}",
            )
            if result.outcome in ("failed", "error", "skipped"):
                tag = {"failed": "failure", "error": "error", "skipped": "skipped"}[result.outcome]
                ET.SubElement(case, tag, message=result.message)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="unicode", xml_declaration=True)
