"""JUnit XML for a run (drift, apply): one test case per host and role, drifted ones failing
with diffs, failed and unreachable hosts as errors, hosts a stopped apply never tried skipped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.reports import RunReport


def write_junit(report: RunReport, path: Path) -> None:
    from engine.reports import HostStatus

    suite = ET.Element("testsuite", name=f"gpuinfra {report.mode} {report.cluster}")
    tests = failures = errors = skipped = 0
    for host in report.hosts.values():
        roles = sorted({op.phase for op in host.operations}) or ["connect"]
        for role in roles:
            tests += 1
            case = ET.SubElement(
                suite, "testcase", classname=host.name, name=role, time=f"{host.seconds:.3f}"
            )
            if host.status is HostStatus.skipped:
                skipped += 1
                ET.SubElement(case, "skipped", message=host.error or "not tried")
                continue
            if host.status in (HostStatus.unreachable, HostStatus.failed):
                errors += 1
                ET.SubElement(case, "error", message=host.error or host.status.value)
                continue
            drifted = [op for op in host.operations if op.phase == role and op.changed]
            if drifted:
                failures += 1
                failure = ET.SubElement(
                    case, "failure", message=f"{len(drifted)} operation(s) would change"
                )
                failure.text = "\n".join(
                    f"{op.name}\n{op.diff}" if op.diff else op.name for op in drifted
                )
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
