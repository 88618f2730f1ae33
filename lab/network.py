"""The lab's network on the machine: a bridge, a namespace and veth per host, NAT to the mirror."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from lab.naming import LINK_ALIAS_PREFIX, LabNames, netns_prefix_of, nft_table_of
from lab.system import run, succeeds, write_sysctl

NETNS_DIR = Path("/run/netns")


def tune_machine() -> None:
    """Machine settings the lab cannot work without (each only ever raised, never lowered)."""
    # Hosts reach the Debian mirror through the machine: it must route for them.
    write_sysctl("net.ipv4.ip_forward", 1)
    # Every host's systemd takes inotify instances; past the default 128 hosts hang in boot.
    write_sysctl("fs.inotify.max_user_instances", 8192, at_least=True)
    write_sysctl("fs.inotify.max_user_watches", 1048576, at_least=True)


# kubelet sets these kernel-wide values at start and fails when it cannot (a lab host's /proc/sys
# outside net.* is read-only). They are the machine's, shared by every host, so the lab sets them
# on the machine before a host runs kubelet, exactly as kubelet would on a node of its own (and as
# kind's privileged nodes let it do): overcommit for Go runtimes, panic and reboot on an oops,
# room for a session keyring per container.
KUBELET_KERNEL_SETTINGS = {
    "vm.overcommit_memory": 1,
    "vm.panic_on_oom": 0,
    "kernel.panic": 10,
    "kernel.panic_on_oops": 1,
    "kernel.keys.root_maxkeys": 1000000,
    "kernel.keys.root_maxbytes": 25000000,
}


def tune_machine_for_kubelet() -> None:
    for key, value in KUBELET_KERNEL_SETTINGS.items():
        write_sysctl(key, value)


def ensure_bridge(names: LabNames, gateway: ipaddress.IPv4Address, prefix: int) -> None:
    bridge = names.bridge
    if not succeeds(["ip", "link", "show", "dev", bridge]):
        run(["ip", "link", "add", bridge, "type", "bridge"])
    run(["ip", "link", "set", "dev", bridge, "alias", names.link_alias])
    run(["ip", "addr", "replace", f"{gateway}/{prefix}", "dev", bridge])
    run(["ip", "link", "set", "dev", bridge, "up"])


def ensure_nat(
    names: LabNames,
    subnet: ipaddress.IPv4Network,
    gateway: ipaddress.IPv4Address | None = None,
    services: dict[int, str] | None = None,
) -> None:
    """Masquerade the lab subnet in a table the lab owns; other tables are never touched.

    services maps a port to what listens there: the hosts' connections to the gateway on that
    port go to the machine's 127.0.0.1 (the package cache of lab/aptcache.py, the registry and
    file server of lab/offline.py), which listen on no other interface.
    """
    table = names.nft_table
    forward = ""
    if gateway is not None and services:
        # The kernel drops packets routed to 127.0.0.0/8 from another interface unless the
        # interface allows it; only the lab's own bridge does.
        write_sysctl(f"net.ipv4.conf.{names.bridge}.route_localnet", 1)
        rules = "\n        ".join(
            f'iifname "{names.bridge}" ip daddr {gateway} tcp dport {port} '
            f'dnat to 127.0.0.1:{port} comment "lab hosts reach {what}"'
            for port, what in sorted(services.items())
        )
        forward = f"""
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        {rules}
    }}"""
    # Create-then-delete-then-define in one transaction: replaces only this table, atomically.
    ruleset = f"""\
table ip {table} {{}}
delete table ip {table}
table ip {table} {{
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {subnet} ip daddr != {subnet} masquerade comment "lab hosts reach the mirror"
    }}{forward}
}}
"""
    run(["nft", "-f", "-"], input=ruleset)


def ensure_host_network(
    names: LabNames,
    host: str,
    index: int,
    address: ipaddress.IPv4Address,
    subnet: ipaddress.IPv4Network,
    gateway: ipaddress.IPv4Address,
) -> None:
    """A namespace holding eth0 with the host's address, a veth to the bridge, a default route.

    Each step checks before acting, so a run that stopped halfway picks up where it was.
    """
    netns = names.netns(host)
    outside = names.veth_outside(index)
    inside = names.veth_inside(index)
    if not (NETNS_DIR / netns).exists():
        run(["ip", "netns", "add", netns])
    in_ns = ["ip", "-n", netns]
    if not succeeds([*in_ns, "link", "show", "dev", "eth0"]):
        if not succeeds(["ip", "link", "show", "dev", outside]):
            run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside,
                 "netns", netns])  # fmt: skip
        run([*in_ns, "link", "set", "dev", inside, "name", "eth0"])
    run(["ip", "link", "set", "dev", outside, "master", names.bridge, "alias", names.link_alias])
    run(["ip", "link", "set", "dev", outside, "up"])
    run([*in_ns, "link", "set", "dev", "lo", "up"])
    run([*in_ns, "addr", "replace", f"{address}/{subnet.prefixlen}", "dev", "eth0"])
    run([*in_ns, "link", "set", "dev", "eth0", "up"])
    run([*in_ns, "route", "replace", "default", "via", str(gateway)])


def set_partitioned(names: LabNames, index: int, partitioned: bool) -> None:
    """Cut (or restore) a host's only link: its peers and the mirror stop (or resume) answering."""
    state = "down" if partitioned else "up"
    run(["ip", "link", "set", "dev", names.veth_outside(index), state])


def lab_links(lab: str) -> list[dict]:
    """Links on the machine carrying this lab's alias (bridge and veths), found without state."""
    links = json.loads(run(["ip", "-j", "link", "show"]) or "[]")
    alias = f"{LINK_ALIAS_PREFIX}{lab}"
    return [link for link in links if link.get("ifalias") == alias]


def link_states(lab: str) -> dict[str, dict]:
    return {link["ifname"]: link for link in lab_links(lab)}


def lab_netns(lab: str) -> list[str]:
    prefix = netns_prefix_of(lab)
    if not NETNS_DIR.is_dir():
        return []
    return sorted(path.name for path in NETNS_DIR.iterdir() if path.name.startswith(prefix))


def nft_table_exists(lab: str) -> bool:
    return succeeds(["nft", "list", "table", "ip", nft_table_of(lab)])


def remove_network(lab: str) -> None:
    """Delete every namespace, link and nft table of the lab, by name and alias, not by state."""
    for netns in lab_netns(lab):
        # Deleting the namespace destroys eth0, and with it the veth's outer end.
        run(["ip", "netns", "delete", netns], check=False)
    for link in lab_links(lab):
        run(["ip", "link", "delete", "dev", link["ifname"]], check=False)
    if nft_table_exists(lab):
        run(["nft", "delete", "table", "ip", nft_table_of(lab)])
