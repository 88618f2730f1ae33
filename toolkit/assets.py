"""Where the Jinja templates and the verification suites are, from a checkout or a wheel.

A checkout (and an editable install) reads them where they live in the repository,
`templates/` and `tests/verify/`; a wheel carries copies of both under `toolkit/_assets/`
(setup.py's build step puts them there), laid out the same way so the suites' own imports
(`tests.verify.probes`) resolve in both.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent / "_assets"
_CHECKOUT = Path(__file__).resolve().parents[1]
# The folder holding `templates/` and `tests/verify/`: the wheel's copy when there is one.
ASSET_ROOT = _PACKAGED if (_PACKAGED / "templates").is_dir() else _CHECKOUT
TEMPLATES = ASSET_ROOT / "templates"
VERIFY_SUITES = ASSET_ROOT / "tests" / "verify"
