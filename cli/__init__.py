"""The gpuinfra command line: typer commands that parse options and call one engine function."""

# pyinfra runs hosts concurrently on gevent: patch before anything imports socket or ssl, as
# pyinfra's own CLI does, or connections to a large inventory would run one at a time.
from gevent import monkey

monkey.patch_all()

from roles.limits import raise_open_files_limit  # noqa: E402

raise_open_files_limit()
