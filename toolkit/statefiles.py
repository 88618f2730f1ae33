"""Atomic, private writes of the controller's files (the cluster state: PKI, TSIG and VRRP
secrets, zone serials), and the lock that serialises writers of one state directory.

A leaf module (standard library only): every writer of a file that must never be seen half
written (state, reports, the lab's records) uses `write_atomically`.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

# The lock every writer of `.state/` holds while it writes: two processes rendering the same
# cluster at once must not mint two CAs or two TSIG keys.
STATE_LOCK = ".lock"
# What `render` writes in place of a secret only `apply` may create (no state yet).
PLACEHOLDER = "PLACEHOLDER-run-gpuinfra-apply"
# Where `etcd snapshot` keeps its copies by default: beside the state, but read by no deploy, so
# the drift fast path leaves them out of the state it digests.
ETCD_SNAPSHOTS = "etcd-snapshots"
_held: set[Path] = set()  # state folders whose lock this process holds
# The kept secrets read in this context while `recording_reads` is active (their paths relative
# to the state folder): what a rollout Job's pods need of .state/ to render what was rendered.
_reads: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("reads", default=None)


class StateMissing(Exception):
    """A read-only command needs a secret that only `apply` creates."""

    def __init__(self, path: Path):
        super().__init__(
            f"no controller state at {path}: run `gpuinfra apply` first, or copy the cluster's "
            ".state/ folder from where it was applied"
        )
        self.path = path


def write_atomically(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace `path` with `data`: readers see the old content or the new, never a part, and a
    crash leaves no partial file under the real name. The file has `mode` from its creation
    (never a wider mode first), whatever the umask. `durable` (state, reports) also waits until
    the data and the rename are on disk; output that can be made again skips that."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; never widened
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    if durable:
        _fsync_dir(path.parent)


def write_secret_atomically(path: Path, data: bytes) -> None:
    """`write_atomically`, readable by the owner only (0600) from the first byte."""
    write_atomically(path, data, 0o600)


def private_dir(path: Path) -> Path:
    """A folder only the owner can enter (0700), made with its parents where missing."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Hold `.state/.lock` exclusively (fcntl.flock; released at exit or when the process
    dies). Callers read what is there under it and write what is missing."""
    key = Path(state_dir).resolve()
    if key in _held:  # already ours: a second flock on a new descriptor would wait for itself
        yield
        return
    private_dir(state_dir)
    fd = os.open(state_dir / STATE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held.add(key)
        yield
    finally:
        _held.discard(key)
        os.close(fd)  # closing the descriptor releases the lock


def _fsync_dir(folder: Path) -> None:
    # The rename itself is durable only once the folder's entry is on disk.
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def recording_reads() -> Iterator[set[str]]:
    """Collect the relative path of every kept secret read (or found missing) inside the block,
    in this thread only: what rendering a host's files asked of the state, derived from the
    rendering itself rather than from a list kept beside it."""
    reads: set[str] = set()
    token = _reads.set(reads)
    try:
        yield reads
    finally:
        _reads.reset(token)


def kept_secret(
    state_dir: Path, relative: str, generate: Callable[[], str], access: str = "create"
) -> str:
    """A random secret the cluster keeps in its state (`state_dir/relative`, 0600).

    Read when present. When missing: `access` "create" generates and keeps it (under the state
    lock, so two processes agree on one), "existing" raises StateMissing, "placeholder" returns
    PLACEHOLDER and writes nothing (the values of inventory.model.StateAccess)."""
    path = state_dir / relative
    reads = _reads.get()
    if reads is not None:
        reads.add(relative)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if access == "placeholder":
            return PLACEHOLDER
        if access != "create":
            raise StateMissing(path) from None
    with state_lock(state_dir):
        try:
            return path.read_text().strip()  # another process made it while we waited
        except FileNotFoundError:
            secret = generate()
            private_dir(path.parent)
            write_secret_atomically(path, (secret + "\n").encode())
            return secret
