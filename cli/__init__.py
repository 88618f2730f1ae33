"""The gpuinfra command line: typer commands that parse options and call one engine function.

Commands import the engine inside their bodies, so `gpuinfra --help` or `inventory validate`
never pay for pyinfra, gevent or ansible (about 1.5 s of CPU together): only the commands that
connect to hosts through pyinfra need them, and those call `connecting()` first.
"""

from __future__ import annotations

import os

# pydantic looks for plugins in the entry points of every installed distribution the first time
# it builds a model (a scan of the whole environment: about 30 ms of CPU per command); gpuinfra
# uses none. An operator who does can still set the variable to something else.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


def connecting() -> None:
    """Prepare this process for pyinfra, before anything imports it: pyinfra runs hosts
    concurrently on gevent, so patch the standard library first, as pyinfra's own CLI does, or
    connections to a large inventory would run one at a time. (The roles package raises the
    open-files limit on import, before pyinfra reads it.)"""
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
