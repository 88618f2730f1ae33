"""Operations of the firewall role: load gpuinfra's table when the kernel's copy differs."""

from __future__ import annotations

import hashlib
import posixpath
import shlex

from pyinfra import host
from pyinfra.api import operation

from roles.firewall.facts import DIGEST, LIST_TABLE, LoadedTable

# Written right after each load: the file's digest and the kernel's listing of the table then.
LOAD_RECORD = "/var/lib/gpuinfra/firewall.loaded"


def content_digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


@operation()
def table_loaded(path: str, content: str, record: str = LOAD_RECORD):
    """Load the table file with `nft -f` (atomic: one transaction replaces the table) when the
    file changed since the last load, or when the kernel's table is not what that load left,
    such as a rule added by hand with `nft add rule`: the managed file alone cannot see that,
    since such a change lives only in the kernel. After loading, the listing is recorded."""
    state = host.get_fact(LoadedTable, record=record)
    wanted = content_digest(content)
    if state["live"] is None:
        reason = "the kernel has no gpuinfra table"
    elif state["file"] != wanted:
        reason = "the table file changed since it was loaded"
    elif state["live"] != state["listing"]:
        reason = "the kernel's gpuinfra table was changed outside gpuinfra"
    else:
        host.noop("the kernel's gpuinfra table is what the file loads")
        return
    quoted, partial = shlex.quote(record), shlex.quote(record + ".partial")
    yield f"echo {shlex.quote(reason)} >&2"
    yield f"mkdir -p {shlex.quote(posixpath.dirname(record))}"
    yield (
        f"nft -f {shlex.quote(path)} && out=$({LIST_TABLE}) && "
        f"printf 'file %s\\nlisting %s\\n' {wanted} \"$(printf '%s\\n' \"$out\" | {DIGEST})\" "
        f"> {partial} && mv -f {partial} {quoted}"
    )
