"""Wall time per test module at the end of every run: what `make test` spends where, for keeping
it under its budget (docs/development.md). A module's time includes its fixtures' setup and
teardown, so a lab of its own counts where it is booted and taken down."""

from __future__ import annotations

from collections import defaultdict

import pytest

_SECONDS: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _SECONDS:
        return
    terminalreporter.section("seconds per module")
    for module, seconds in sorted(_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {module}")
    terminalreporter.write_line(f"{sum(_SECONDS.values()):8.1f}  in all")
