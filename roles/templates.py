"""The Jinja environment every role renders its files with (templates/<role>/<file>.j2)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@cache
def environment() -> jinja2.Environment:
    # StrictUndefined: a missing variable is an error, never an empty string in a config file.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(name: str, **context: object) -> str:
    return environment().get_template(name).render(**context)
