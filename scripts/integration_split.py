"""Choose the integration modules that `make test` runs in its side process, by the last run's
times: the modules with labs of their own go beside the shared-lab modules, longest first, each
to the process that would end sooner, so both end about together; the modules sharing another
lab (the Kubernetes one) go to one process together.

    python3 scripts/integration_split.py    # the side process's modules, one per line
    python3 scripts/integration_split.py --last-run    # each process's seconds per module,
                                                       # and the fixture setup's share of them

The times are what tests/integration/conftest.py wrote after each run (build/integration-times/,
newest run first for each module), over the figures committed in
tests/integration/module-times.json (a clean clone's only record). A module never measured
counts as a shared-lab one: it stays in the main process, which is always correct.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tests" / "integration" / "module-times.json"
TIMES_DIR = REPO / "build" / "integration-times"
# What `make test-long` runs (scripts/long-tests.sh): make test deselects their
# tests by marker, so they are never part of its split, whatever their recorded times.
LONG_SUITES = ("tests/integration/test_faults.py", "tests/integration/test_kubernetes_upgrade.py")


def measured(baseline: Path = BASELINE, times_dir: Path = TIMES_DIR) -> dict[str, dict]:
    """Module -> {"seconds", "shared_lab"}: the committed figures, then each run's, oldest first."""
    runs = [json.loads(baseline.read_text())] if baseline.exists() else []
    if times_dir.is_dir():
        recorded = [json.loads(path.read_text()) for path in sorted(times_dir.glob("*.json"))]
        runs += sorted(recorded, key=lambda run: run.get("finished", 0))
    times: dict[str, dict] = {}
    for run in runs:
        times.update(run["modules"])
    return times


def side_modules(modules: list[str], times: dict[str, dict]) -> list[str]:
    """The own-lab modules for the side process: longest first, each to the process whose
    running total is smaller (the shared-lab modules all run in the main one). Modules that
    share a lab of their own (a "lab" name) go together, as one, and run one after another."""
    own = [m for m in modules if m in times and not times[m]["shared_lab"]]
    main = sum(times[m]["seconds"] for m in modules if m in times and m not in own)
    units: dict[str, list[str]] = {}
    for module in own:
        units.setdefault(times[module].get("lab") or module, []).append(module)

    def seconds(unit: list[str]) -> float:
        return sum(times[m]["seconds"] for m in unit)

    side, side_total = [], 0.0
    for unit in sorted(units.values(), key=lambda u: (-seconds(u), u)):
        if side_total <= main:
            side.append(sorted(unit))
            side_total += seconds(unit)
        else:
            main += seconds(unit)
    # In the order pytest runs them: a shared lab's modules one after another, so no other lab
    # is booted while it is up (test_etcd_hardening.py between the Kubernetes lab's modules put
    # three labs on the machine's disk at once, and kubelet tainted gpu-1 with disk pressure).
    return [module for unit in sorted(side) for module in unit]


def make_test_modules(repo: Path = REPO) -> list[str]:
    """The integration modules make test runs: every one but the long suites'."""
    found = (str(p.relative_to(repo)) for p in (repo / "tests" / "integration").glob("test_*.py"))
    return sorted(module for module in found if module not in LONG_SUITES)


def last_run(times_dir: Path = TIMES_DIR) -> list[str]:
    """The last run's seconds per module, each process's, for the end of make test's log."""
    lines = []
    for process in ("main", "side"):
        path = times_dir / f"{process}.json"
        if not path.is_file():
            continue
        for module, entry in sorted(json.loads(path.read_text())["modules"].items()):
            lab = "shared lab" if entry["shared_lab"] else "own lab"
            setup = entry.get("setup_seconds", 0.0)
            lines.append(
                f"  {process} {entry['seconds']:8.1f}  setup {setup:7.1f}  {module} ({lab})"
            )
    return lines


def main() -> int:
    if sys.argv[1:] == ["--last-run"]:
        print("\n".join(last_run()))
        return 0
    for module in side_modules(make_test_modules(), measured()):
        print(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
