"""Map a Kubespray or DeepOps Ansible inventory, read by ansible-core, to the cluster model."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inventory.building import RoleChecks, build
from inventory.errors import InventoryError, InventoryInvalid
from inventory.model import LoadedCluster
from inventory.versions import unsupported_kubernetes

# Kubespray and DeepOps group names (both spellings: `-` was renamed to `_` in Kubespray 2.16).
GROUP_MAP = {
    "kube_control_plane": "control_plane",
    "kube-master": "control_plane",
    "kube_master": "control_plane",
    "etcd": "etcd",
    "kube_node": "cpu_worker",
    "kube-node": "cpu_worker",
    "gpu": "gpu_worker",
    "gpus": "gpu_worker",
    "gpu_nodes": "gpu_worker",
    "haproxy": "loadbalancer",
    "lb": "loadbalancer",
    "loadbalancer": "loadbalancer",
    "dns": "dns",
    "monitoring": "monitoring",
    "control_plane": "control_plane",
    "gpu_worker": "gpu_worker",
    "cpu_worker": "cpu_worker",
}
# Parent or bookkeeping groups that carry no role of their own.
STRUCTURAL_GROUPS = {"all", "ungrouped", "k8s_cluster", "k8s-cluster", "calico_rr", "bastion"}

# Host variables the importer understands; the first present address variable wins, in this
# order, because Kubespray binds services to `ip` and only reaches hosts by `ansible_host`.
ADDRESS_VARS = ("ip", "access_ip", "ansible_host")
HOST_VARS = {
    *ADDRESS_VARS,
    "ansible_user",
    "ansible_port",
    "ansible_ssh_private_key_file",
    "etcd_member_name",
    "gpu_model",
    "gpu_count",
}
CLUSTER_VARS = {
    "cluster_name",
    "kube_pods_subnet",
    "kube_service_addresses",
    "kube_version",
    "etcd_version",
    "kube_apiserver_port",
    "loadbalancer_apiserver",
}
# Variables Ansible itself adds to every host; not the operator's to map.
ANSIBLE_MAGIC = {
    "inventory_file",
    "inventory_dir",
    "inventory_hostname",
    "inventory_hostname_short",
    "group_names",
    "groups",
    "omit",
    "playbook_dir",
    "ansible_playbook_python",
    "ansible_config_file",
    "ansible_version",
    "ansible_check_mode",
    "ansible_diff_mode",
    "ansible_forks",
    "ansible_inventory_sources",
    "ansible_skip_tags",
    "ansible_run_tags",
    "ansible_verbosity",
    "ansible_facts",
}


@dataclass
class ImportResult:
    data: dict[str, Any]  # the cluster file's content
    loaded: LoadedCluster
    unmapped: list[str] = field(default_factory=list)  # what could not be carried over, and why


def import_ansible(
    path: Path,
    *,
    name: str | None = None,
    node_network: str | None = None,
    role_checks: RoleChecks | None = None,
) -> ImportResult:
    """Map an Ansible inventory (INI or YAML, with group_vars/host_vars) to a validated cluster."""
    hosts, groups_of, unmapped = _read_with_ansible(path)
    if not hosts:
        raise InventoryInvalid([InventoryError(path, "", "ansible-core found no hosts in it")])
    cluster_name = name or _default_name(path)
    data: dict[str, Any] = {"name": cluster_name, "hosts": {}}
    errors: list[InventoryError] = []
    ssh: dict[str, Any] = {}
    versions: dict[str, str] = {}
    networks: dict[str, Any] = {}
    api: dict[str, Any] = {}
    unknown_vars: dict[str, list[str]] = {}

    for host_name, variables in hosts.items():
        entry: dict[str, Any] = {}
        address = next((variables[v] for v in ADDRESS_VARS if v in variables), None)
        if address is None and _is_ipv4(host_name):
            address = host_name
        if address is None:
            errors.append(InventoryError(path, host_name, "no ip, access_ip or ansible_host"))
            continue
        entry["address"] = str(address)
        mapped_groups = []
        for group in groups_of[host_name]:
            if group in GROUP_MAP and GROUP_MAP[group] not in mapped_groups:
                mapped_groups.append(GROUP_MAP[group])
        if "gpu_worker" in mapped_groups and "cpu_worker" in mapped_groups:
            mapped_groups.remove("cpu_worker")  # a GPU group refines Kubespray's kube_node
        entry["groups"] = mapped_groups
        if "gpu_model" in variables or "gpu_count" in variables:
            entry["gpu"] = {
                "model": str(variables.get("gpu_model", "unknown")),
                "count": int(variables.get("gpu_count", 1)),
            }
        member = variables.get("etcd_member_name")
        if member and "etcd" in mapped_groups and member != host_name:
            entry["etcd"] = {"member_name": str(member)}
        for key, setting in (
            ("ansible_user", "user"),
            ("ansible_port", "port"),
            ("ansible_ssh_private_key_file", "key"),
        ):
            if key in variables:
                value = int(variables[key]) if setting == "port" else str(variables[key])
                if setting in ssh and ssh[setting] != value:
                    unmapped.append(
                        f"{host_name}: {key}={value} differs from another host's "
                        f"({ssh[setting]}); gpuinfra uses one SSH {setting} per cluster"
                    )
                else:
                    ssh[setting] = value
        _cluster_vars(variables, data, versions, networks, api)
        for key in set(variables) - HOST_VARS - CLUSTER_VARS - ANSIBLE_MAGIC:
            unknown_vars.setdefault(key, []).append(host_name)
        data["hosts"][host_name] = entry

    if errors:
        raise InventoryInvalid(errors)
    for key, owners in unknown_vars.items():
        where = ", ".join(owners) if len(owners) <= 3 else f"{len(owners)} hosts"
        unmapped.append(f"variable {key} ({where}) has no gpuinfra equivalent")
    data.setdefault("domain", f"{cluster_name}.local")
    networks["node"] = node_network or _covering_network(
        [h["address"] for h in data["hosts"].values()]
    )
    data["networks"] = networks
    if not networks.get("admin"):
        # Ansible inventories name no admin networks; a filtering firewall without them would
        # shut the controller out, so it starts disabled and says how to turn it on.
        data["group_vars"] = {"all": {"firewall": {"enabled": False}}}
        unmapped.append(
            "firewall disabled: the inventory names no admin networks; set networks.admin "
            "(where the controller connects from), then remove group_vars.all.firewall"
        )
    if ssh:
        data["ssh"] = ssh
    if versions:
        data["versions"] = versions
    if api:
        data["api"] = api
    base_dir = path.parent if path.is_file() else path
    loaded = build(data, source=path, base_dir=base_dir, role_checks=role_checks)
    unsupported = unsupported_kubernetes(loaded.cluster.versions.kubernetes)
    if unsupported:
        # Written as imported (the file says what the cluster runs), but said now, in one
        # line, rather than first by `inventory validate`.
        unmapped.append(f"kube_version {loaded.cluster.versions.kubernetes}: {unsupported}")
    return ImportResult(data=data, loaded=loaded, unmapped=sorted(set(unmapped)))


def _accept_int_subclass_ports() -> None:
    """ansible-core probes at import whether socket.getaddrinfo takes an int subclass as port
    and patches it when not. Under gevent (pyinfra's concurrency, patched in by the CLI) the
    probe fails inside gevent's resolver thread pool, which prints that failure as a traceback
    although ansible handles it. Doing ansible's patch first makes its probe pass quietly."""
    original = socket.getaddrinfo
    if getattr(original, "_gpuinfra_int_ports", False):
        return

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(port, int) and type(port) is not int:
            port = int(port)
        return original(host, port, *args, **kwargs)

    getaddrinfo._gpuinfra_int_ports = True  # type: ignore[attr-defined]
    socket.getaddrinfo = getaddrinfo


def _read_with_ansible(path: Path) -> tuple[dict[str, dict], dict[str, list[str]], list[str]]:
    # ansible-core reads its configuration at import; keep it quiet and local to this process.
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")
    _accept_int_subclass_ports()
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variable_manager = VariableManager(loader=loader, inventory=manager)
    hosts: dict[str, dict] = {}
    groups_of: dict[str, list[str]] = {}
    unmapped: list[str] = []
    for host in manager.get_hosts():
        variables = variable_manager.get_vars(host=host, include_hostvars=False)
        hosts[host.name] = {k: _plain(v) for k, v in variables.items() if not k.startswith("_")}
        groups_of[host.name] = [g.name for g in host.get_groups()]
    for group in manager.groups:
        if group not in GROUP_MAP and group not in STRUCTURAL_GROUPS:
            unmapped.append(
                f"group {group} has no gpuinfra equivalent; its hosts keep their others"
            )
    return hosts, groups_of, unmapped


def _plain(value: Any) -> Any:
    """ansible-core 2.19 wraps values in tagged types; reduce them to plain Python data."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    for plain in (bool, int, float, str):
        if isinstance(value, plain):
            return plain(value)
    return value


def _cluster_vars(variables: dict, data: dict, versions: dict, networks: dict, api: dict) -> None:
    if "cluster_name" in variables:
        data["domain"] = str(variables["cluster_name"])
    if "kube_pods_subnet" in variables:
        networks["pod"] = str(variables["kube_pods_subnet"])
    if "kube_service_addresses" in variables:
        networks["service"] = str(variables["kube_service_addresses"])
    if "kube_version" in variables:
        versions["kubernetes"] = str(variables["kube_version"]).lstrip("v")
    if "etcd_version" in variables:
        versions["etcd"] = str(variables["etcd_version"]).lstrip("v")
    if "kube_apiserver_port" in variables:
        api["port"] = int(variables["kube_apiserver_port"])
    balancer = variables.get("loadbalancer_apiserver")
    if isinstance(balancer, dict) and "address" in balancer:
        api["vip"] = str(balancer["address"])


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _covering_network(addresses: list[str]) -> str:
    """The smallest network (at most a /24) holding every address: Ansible inventories have no
    node network of their own; pass --node-network to set it."""
    parsed = [ipaddress.IPv4Address(a) for a in addresses]
    prefix = 24
    while prefix > 0:
        network = ipaddress.IPv4Network(f"{parsed[0]}/{prefix}", strict=False)
        if all(a in network for a in parsed):
            return str(network)
        prefix -= 1
    return "0.0.0.0/0"


def _default_name(path: Path) -> str:
    folder = path if path.is_dir() else path.parent
    name = "".join(c if c.isalnum() else "-" for c in folder.resolve().name.lower()).strip("-")
    return name or "imported"
