"""The Jinja environment every role renders its files with (templates/<role>/<file>.j2)."""

from __future__ import annotations

from functools import cache

import jinja2

from toolkit import assets

TEMPLATES = assets.TEMPLATES  # the checkout's templates/, or the wheel's copy


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
    """A template rendered as a text file: ending in a newline, as POSIX text files do. (A
    template that ends on a block tag loses its last newline to `trim_blocks`.)"""
    text = environment().get_template(name).render(**context)
    return text if not text or text.endswith("\n") else text + "\n"
