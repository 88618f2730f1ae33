"""Build step that ships the templates and the verification suites inside the wheel.

The folders stay where a reader looks for them (`templates/`, `tests/verify/`); a built wheel
gets copies under `toolkit/_assets/` (found by toolkit/assets.py). An editable install reads the
checkout itself, so it copies nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# (source in the checkout, destination under the built `toolkit` package)
ASSETS = [
    (HERE / "templates", Path("_assets/templates")),
    (HERE / "tests" / "__init__.py", Path("_assets/tests/__init__.py")),
    (HERE / "tests" / "verify", Path("_assets/tests/verify")),
]


class BuildWithAssets(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        toolkit = Path(self.build_lib) / "toolkit"
        for source, destination in ASSETS:
            target = toolkit / destination
            if source.is_dir():
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(
                    source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


setup(cmdclass={"build_py": BuildWithAssets})
