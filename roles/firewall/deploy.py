"""The firewall role's deploy: nftables, gpuinfra's table checked then loaded, boot persistence."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, systemd

from roles.firewall.files import SERVICE_DROPIN, TABLE_FILE, managed_files
from roles.firewall.operations import table_loaded
from toolkit.operations import put_file, service_running
from toolkit.spec import HostContext


@deploy("Firewall")
def apply(ctx: HostContext) -> None:
    apt.packages(name="Install nftables", packages=["nftables"], no_recommends=True)
    files = managed_files(ctx)
    written = {f.path: put_file(f) for f in files}
    systemd.daemon_reload(
        name="Reload systemd for the nftables drop-in", _if=written[SERVICE_DROPIN].did_change
    )
    # Enabled for boot; starting it loads /etc/nftables.conf, which only includes our table.
    service_running(name="Run nftables", unit="nftables")
    table = next(f for f in files if f.path == TABLE_FILE)
    table_loaded(name="Load the gpuinfra table", path=TABLE_FILE, content=table.content)
