"""Inventory strings that reach root shells or admin-applied YAML are checked by their grammar
at load: each hostile value (a command separator, a substitution, a newline, a parent folder,
backticks) is refused with exit 2 and one line naming its key, and a reserved namespace is
refused for the Jobs."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Union

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from cli.main import app
from engine.registry import ROLE_CONFIGS
from inventory.model import Cluster

# A trailing newline too: a regular expression's `$` matches before one.
HOSTILE = [
    "1.2.3; rm -rf /", "$(reboot)", "1.2.3\nreboot", "../../etc", "`reboot`", "a b", "1.2.3\n",
]  # fmt: skip


def _etcd_disk(cluster: dict[str, Any], value: Any) -> None:
    cluster["hosts"]["etcd-1"]["etcd"] = {"disk": value}


def _setting(role: str, key: str, wrap=lambda v: v):
    def put(cluster: dict[str, Any], value: Any) -> None:
        cluster.setdefault("group_vars", {}).setdefault("all", {}).setdefault(role, {})[key] = wrap(
            value
        )

    return put


def _version(key: str):
    def put(cluster: dict[str, Any], value: Any) -> None:
        cluster.setdefault("versions", {})[key] = value

    return put


def _data_volume(key: str, wrap=lambda v: v):
    def put(cluster: dict[str, Any], value: Any) -> None:
        volume = {"name": "data", "disks": ["/dev/disk/by-id/nvme-a", "/dev/disk/by-id/nvme-b"]}
        volume[key] = wrap(value)
        workers = cluster.setdefault("group_vars", {}).setdefault("gpu_worker", {})
        workers["data_disks"] = {"volumes": [volume]}

    return put


def _ssh_user(cluster: dict[str, Any], value: Any) -> None:
    cluster.setdefault("ssh", {})["user"] = value


# key as the error names it -> how to set it
FIELDS = {
    "versions.etcd": _version("etcd"),
    "versions.containerd": _version("containerd"),
    "versions.docker": _version("docker"),
    # The NVIDIA pins are checked as versions and against each other by the nvidia role.
    "versions.nccl": _version("nccl"),
    "kubernetes.package_revision": _setting("kubernetes", "package_revision"),
    "kubernetes.cni_plugins_version": _setting("kubernetes", "cni_plugins_version"),
    "kubernetes.cri_tools_version": _setting("kubernetes", "cri_tools_version"),
    "kubernetes.ignore_preflight_errors": _setting(
        "kubernetes", "ignore_preflight_errors", lambda v: ["SystemVerification", v]
    ),
    "drift_job.namespace": _setting("drift_job", "namespace"),
    "rollout_job.namespace": _setting("rollout_job", "namespace"),
    "etcd.disk": _etcd_disk,
    "data_disks.volumes.0.disks": _data_volume(
        "disks", lambda v: ["/dev/disk/by-id/nvme-a", f"/dev/disk/by-id/{v}"]
    ),
    "data_disks.volumes.0.mountpoint": _data_volume("mountpoint", lambda v: f"/data/{v}"),
    # Found unchecked on 2026-11-29: backup_dir reached the etcd-backup script unquoted
    # (`mkdir -p /var/b; touch /tmp/pwned #`), data_dir the members' units.
    "etcd.data_dir": _setting("etcd", "data_dir", lambda v: f"/var/{v}"),
    "etcd.backup_dir": _setting("etcd", "backup_dir", lambda v: f"/var/{v}"),
    "gpu_health.textfile_dir": _setting("gpu_health", "textfile_dir", lambda v: f"/var/{v}"),
    # apt-get's command line, chrony's and journald's configuration, the backup timer, named's
    # options, the login of every ssh command.
    "base.packages": _setting("base", "packages", lambda v: ["jq", v]),
    "base.ntp_servers": _setting("base", "ntp_servers", lambda v: [v]),
    "base.journald_max_use": _setting("base", "journald_max_use"),
    "dns.dnssec_validation": _setting("dns", "dnssec_validation"),
    "ssh.user": _ssh_user,
    # Compared with the paths drift finds: a relative one or one with `..` never matches.
    "base.site_files": _setting("base", "site_files", lambda v: [f"/etc/ssh/sshd_config.d/{v}"]),
    # /etc/hosts lines: a second line would name another host's address.
    "base.extra_hosts": _setting("base", "extra_hosts", lambda v: {f"mirror{v}": "10.0.0.1"}),
    # The NVIDIA pins, like nccl above.
    "versions.nvidia_driver": _version("nvidia_driver"),
    "versions.cuda": _version("cuda"),
    "versions.cudnn": _version("cudnn"),
    # apt-get's and apt-mark's command lines; modules-load.d and modprobe; the GRUB drop-in that
    # update-grub sources as root; limits.conf and system.conf; /etc/sysctl.d's lines.
    "kernel.kernel_package": _setting("kernel", "kernel_package"),
    "kernel.kernel_version": _setting("kernel", "kernel_version"),
    "kernel.modules": _setting("kernel", "modules", lambda v: ["overlay", v]),
    "kernel.gpu_modules": _setting("kernel", "gpu_modules", lambda v: [v]),
    "kernel.grub_cmdline": _setting("kernel", "grub_cmdline", lambda v: ["iommu=pt", v]),
    "kernel.memlock": _setting("kernel", "memlock"),
    "kernel.sysctls": _setting("kernel", "sysctls", lambda v: {f"net.core.{v}": 1}),
}


def validate(small_cluster, write_cluster):
    return CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("key", FIELDS)
def test_a_hostile_value_is_refused_naming_its_key(small_cluster, write_cluster, key, value):
    FIELDS[key](small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if key in line]
    assert lines, result.stderr


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-node-lease", "default"])
@pytest.mark.parametrize("job", ["drift_job", "rollout_job"])
def test_a_job_in_a_reserved_namespace_is_refused(small_cluster, write_cluster, job, namespace):
    _setting(job, "namespace")(small_cluster, namespace)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert f"{job}.namespace" in result.stderr and "reserved to Kubernetes" in result.stderr, (
        result.stderr
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("versions.etcd", "3.6.5"),
        ("kubernetes.package_revision", "1.1"),
        ("kubernetes.cni_plugins_version", "1.9.0"),
        ("kubernetes.cri_tools_version", "1.35.0"),
        (
            "kubernetes.ignore_preflight_errors",
            "FileContent--proc-sys-net-bridge-bridge-nf-call-iptables",
        ),
        ("drift_job.namespace", "fleet-ops"),
        ("etcd.disk", "/dev/disk/by-id/nvme-Samsung_SSD_980_PRO_1TB_S5GX.0-part1"),
        ("data_disks.volumes.0.mountpoint", "checkpoints"),
        ("etcd.data_dir", "lib/etcd-main"),
        ("etcd.backup_dir", "backups/etcd_hourly"),
        ("gpu_health.textfile_dir", "lib/node-exporter"),
        ("base.packages", "nvme-cli=2.13-2"),
        ("base.ntp_servers", "ntp1.example.internal"),
        ("base.journald_max_use", "4G"),
        ("dns.dnssec_validation", "yes"),
        ("ssh.user", "deploy"),
        ("base.extra_hosts", ".debian.internal"),
        ("base.site_files", "50-site.conf"),
        ("kernel.kernel_package", "linux-image-generic-hwe-22.04"),
        ("kernel.kernel_version", "6.8.0-60.63~22.04.1"),
        ("kernel.modules", "nvidia-peermem"),
        ("kernel.gpu_modules", "nvidia_uvm"),
        ("kernel.grub_cmdline", "console=ttyS0,115200n8"),
        ("kernel.memlock", "67108864"),
        ("kernel.sysctls", "rmem_max"),
    ],
)
def test_well_formed_values_pass(small_cluster, write_cluster, key, value):
    """The controls: the same fields, each with a value of its grammar."""
    FIELDS[key](small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("value", ["hourly\nExecStartPre=/bin/true", "hourly; reboot", "$(reboot)",
                                   "`reboot`", "hourly\n"])  # fmt: skip
def test_a_backup_schedule_is_one_calendar_event(small_cluster, write_cluster, value):
    """A systemd calendar event has spaces and `..` of its own (Mon..Fri 02:00): what it must
    not have is a second line in the timer unit or a shell's characters."""
    _setting("etcd", "backup_schedule")(small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert "etcd.backup_schedule" in result.stderr, result.stderr
    # Control: calendar events of systemd's own grammar pass.
    for good in ("hourly", "Mon..Fri 02:00", "*-*-* 00/6:00:00"):
        _setting("etcd", "backup_schedule")(small_cluster, good)
        assert validate(small_cluster, write_cluster).exit_code == 0, good


@pytest.mark.parametrize("value", ["1\nkernel.core_pattern=|/bin/sh", "1; reboot", "$(reboot)",
                                   "`reboot`", "4096 87380\n", "1  2"])  # fmt: skip
def test_a_sysctl_value_is_one_line_of_words(small_cluster, write_cluster, value):
    """Some sysctls take words (net.ipv4.tcp_rmem: 4096 87380 16777216): what a value must not
    have is a second line of /etc/sysctl.d, which would set another sysctl, or a shell's
    characters."""
    _setting("kernel", "sysctls", lambda v: {"net.ipv4.tcp_rmem": v})(small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert "kernel.sysctls" in result.stderr, result.stderr
    # Control: values of the kernel's own shapes pass.
    for good in ("4096 87380 16777216", "1", "/var/crash/core.%e.%p"):
        _setting("kernel", "sysctls", lambda v: {"net.ipv4.tcp_rmem": v})(small_cluster, good)
        assert validate(small_cluster, write_cluster).exit_code == 0, good


# URLs and images have `..` and `/` of their own: what they must not carry is a shell's or a
# configuration file's characters (containerd's TOML, apt's sources, curl's command lines).
URL_OR_IMAGE = {
    "base.apt_proxy": _setting("base", "apt_proxy", lambda v: f"http://proxy.internal:3142/{v}"),
    "kubernetes.binaries_url": _setting(
        "kubernetes", "binaries_url", lambda v: f"https://files.internal/{v}"
    ),
    "etcd.mirror_url": _setting("etcd", "mirror_url", lambda v: f"https://files.internal/{v}"),
    "container_runtime.sandbox_image": _setting(
        "container_runtime", "sandbox_image", lambda v: f"registry.internal/pause:3.10{v}"
    ),
    "drift_job.image": _setting("drift_job", "image", lambda v: f"registry.internal/gpuinfra{v}"),
    "rollout_job.image": _setting(
        "rollout_job", "image", lambda v: f"registry.internal/gpuinfra{v}"
    ),
    "gpu_health.image": _setting("gpu_health", "image", lambda v: f"registry.internal/health{v}"),
    "base.apt_mirror": _setting("base", "apt_mirror", lambda v: f"http://apt.internal/{v}"),
    "base.apt_security_mirror": _setting(
        "base", "apt_security_mirror", lambda v: f"http://apt.internal/{v}"
    ),
    "container_runtime.containerd_url": _setting(
        "container_runtime", "containerd_url", lambda v: f"https://files.internal/{v}"
    ),
    "container_runtime.docker_repo_url": _setting(
        "container_runtime", "docker_repo_url", lambda v: f"https://apt.internal/{v}"
    ),
    "kubernetes.repo_url": _setting(
        "kubernetes", "repo_url", lambda v: f"https://apt.internal/{v}"
    ),
    "kubernetes.cni_plugins_url": _setting(
        "kubernetes", "cni_plugins_url", lambda v: f"https://files.internal/{v}"
    ),
    "kubernetes.cri_tools_url": _setting(
        "kubernetes", "cri_tools_url", lambda v: f"https://files.internal/{v}"
    ),
    "nvidia.repo_url": _setting("nvidia", "repo_url", lambda v: f"https://apt.internal/{v}"),
    "nvidia.mirror_url": _setting("nvidia", "mirror_url", lambda v: f"https://apt.internal/{v}"),
    # containerd's hosts.toml, kube-apiserver's flags, kubeadm's and the DaemonSets' YAML,
    # alertmanager.yml.
    "container_runtime.registry_mirrors": _setting(
        "container_runtime",
        "registry_mirrors",
        lambda v: {"docker.io": [f"https://m.internal/{v}"]},
    ),
    "kubernetes.events_etcd_endpoints": _setting(
        "kubernetes", "events_etcd_endpoints", lambda v: [f"https://10.0.0.81:2379/{v}"]
    ),
    "kubernetes.image_repository": _setting(
        "kubernetes", "image_repository", lambda v: f"registry.internal/k8s{v}"
    ),
    "fleet_policy.pause_image": _setting(
        "fleet_policy", "pause_image", lambda v: f"registry.internal/pause{v}"
    ),
    "fleet_policy.device_plugin_image": _setting(
        "fleet_policy", "device_plugin_image", lambda v: f"registry.internal/plugin{v}"
    ),
    "fleet_policy.dcgm_exporter_image": _setting(
        "fleet_policy", "dcgm_exporter_image", lambda v: f"registry.internal/dcgm{v}"
    ),
    "monitoring.alert_webhooks": _setting(
        "monitoring", "alert_webhooks", lambda v: [f"https://hooks.internal/{v}"]
    ),
}


@pytest.mark.parametrize("value", ["; reboot", "$(reboot)", "`reboot`", " x", "\nx", "'x", '"x'])
@pytest.mark.parametrize("key", URL_OR_IMAGE)
def test_a_url_or_an_image_with_a_shells_characters_is_refused(
    small_cluster, write_cluster, key, value
):
    URL_OR_IMAGE[key](small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert key in result.stderr, result.stderr


@pytest.mark.parametrize("key", URL_OR_IMAGE)
def test_a_plain_url_or_image_passes(small_cluster, write_cluster, key):
    """The control: the same fields with plain values (a port, a path, a tag)."""
    URL_OR_IMAGE[key](small_cluster, "v1.2/x_y-z")
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 0, result.output


# Fields of words one space apart (a cron schedule, a comment, a command line): what they must
# not carry is a second line or a shell's characters. key -> (how to set it, its good values)
SPACED = {
    "gpu_health.cronjob_schedule": (
        _setting("gpu_health", "cronjob_schedule"),
        ["17 */6 * * *", "0 3,15 * * *"],
    ),
    "gpu_health.remote_command": (
        _setting("gpu_health", "remote_command"),
        ["gpuinfra health run --format json"],
    ),
    # An nft rule's comment.
    "firewall.extra_rules.description": (
        _setting(
            "firewall",
            "extra_rules",
            lambda v: [{"port": 9000, "sources": ["10.0.0.0/8"], "description": v}],
        ),
        ["extra rule from the inventory", "node-exporter for the site Prometheus, 10.0.0.0/8"],
    ),
}


@pytest.mark.parametrize("value", ["a\nb", "a; reboot", "$(reboot)", "`reboot`", "a\n", "a  b",
                                   "a 'b'", 'a "b"', "a # b", "a\\b"])  # fmt: skip
@pytest.mark.parametrize("key", SPACED)
def test_words_with_a_shells_characters_are_refused(small_cluster, write_cluster, key, value):
    SPACED[key][0](small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert key in _tested(result.stderr), result.stderr


@pytest.mark.parametrize("key", SPACED)
def test_plain_words_pass(small_cluster, write_cluster, key):
    """The controls: each field's own values."""
    put, good = SPACED[key]
    for value in good:
        put(small_cluster, value)
        result = validate(small_cluster, write_cluster)
        assert result.exit_code == 0, (value, result.output)


@pytest.mark.parametrize(
    "value", ["id\nProxyCommand sh -c reboot", "id\r", 'id" ProxyCommand x', "id\t"]
)
@pytest.mark.parametrize("key", ["key", "known_hosts"])
def test_an_ssh_path_that_would_break_ssh_config_is_refused(
    small_cluster, write_cluster, tmp_path, key, value
):
    """The controller's ssh_config names ssh.key and ssh.known_hosts, quoted where they have a
    space: a newline there would start a directive of its own (ProxyCommand runs a shell), and a
    double quote would end the quoting."""
    small_cluster.setdefault("ssh", {})[key] = f"keys/{value}"
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert f"ssh.{key}" in result.stderr, result.stderr
    # Control: a path with a space, which ssh_config takes quoted, passes.
    control = tmp_path / "the fleet" / "id_ed25519"
    control.parent.mkdir()
    control.write_text("")
    control.chmod(0o600)
    small_cluster["ssh"][key] = str(control)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 0, result.output


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.mark.parametrize(
    "value",
    [f"{KEY} ops\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK other", "ops@bastion", f"{KEY[:11]}",
     "ssh-ed25519 $(reboot)", f"{KEY}\r"],
)  # fmt: skip
def test_a_declared_key_is_one_line_holding_a_key(small_cluster, write_cluster, value):
    """base.authorized_keys: a second key smuggled on a new line, or a line with no key (which
    drift would quietly never match), is refused, naming the key."""
    _setting("base", "authorized_keys", lambda v: [v])(small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 2, result.output
    assert "base.authorized_keys" in result.stderr and "public key" in result.stderr, result.stderr


@pytest.mark.parametrize("value", [KEY, f"{KEY} ops@bastion", f'from="10.0.0.0/8" {KEY} ci'])
def test_a_declared_key_with_options_or_a_comment_passes(small_cluster, write_cluster, value):
    _setting("base", "authorized_keys", lambda v: [v])(small_cluster, value)
    result = validate(small_cluster, write_cluster)
    assert result.exit_code == 0, result.output


# Every string an inventory can set, derived from the models themselves (the Cluster and each
# role's settings as the registry lists them), so that a field added tomorrow is checked too.
# A field passes when a table above sends it hostile values, when its own type refuses every
# hostile value shown below, or when it is declared here, having been read where it is used.

# Hostile values in the shapes a grammar might let through: alone, after a well-formed start (a
# pattern anchored at the start only) and before a well-formed end (one anchored at the end).
SHAPES = [
    shape
    for value in HOSTILE
    for shape in (value, f"a{value}", f"/var/lib/{value}", f"https://files.internal/{value}",
                  f"{value}a")
]  # fmt: skip
# A type that refuses these and its own default as well refuses everything, which shows
# nothing: one of them must pass.
PLAIN = ["a", "1.2", "/var/lib/a", "https://files.internal/a", "registry.internal/a:1.2"]
# Well-formed values of the grammars that none of those fit and that have no default.
CONTROLS = {
    "container_runtime.containerd_sha256": "0" * 64,
    "kubernetes.binary_sha256.*": "0" * 64,
    "kubernetes.release_sha256.*.*": "0" * 64,
    "kubernetes.coredns_image_tag": "v1.12.1",
    "monitoring.retention_size": "100GB",
    "monitoring.scrape_interval": "15s",
    "shared_fs.directories.mode": "0750",
    "kubernetes.calico_manifest_sha256": "0" * 64,
    "etcd.sha256": "0" * 64,
    "shared_fs.existing.fsid": "0e3b1f5c-8a2d-4c6e-9f10-2b7d5a4c3e21",
    # Its model also asks for nofail, which a lone plain option lacks.
    "data_disks.volumes.options": "nofail",
    "fabric.nccl_extra.<key>": "NCCL_IB_HCA",
}

# Fields that take any text and never reach a shell or a host's file unquoted: name -> where
# it is used and why that is safe.
DECLARED: dict[str, str] = {
    "group_vars.*.<key>": "a role's name: engine/context.py:_unknown_roles refuses any other",
    "hosts.*.vars.<key>": "a role's name: engine/context.py:_unknown_roles refuses any other",
    "group_vars.*.*.<key>": "a setting's name: the role's model forbids unknown keys",
    "hosts.*.vars.*.<key>": "a setting's name: the role's model forbids unknown keys",
    "group_vars.*.*.*": "a setting: engine/context.py:check_roles validates it by the role models "
    "walked here",
    "hosts.*.vars.*.*": "a setting: engine/context.py:check_roles validates it by the role models "
    "walked here",
    "firewall.foreign_tables": "only compared with the tables nft lists (roles/firewall/deploy.py:"
    "apply), never written",
    "drift_job.nodes": "must name a node of the inventory (toolkit/jobs.py:not_a_node), a HostName",
    "rollout_job.nodes": "must name a node of the inventory (toolkit/jobs.py:not_a_node), a "
    "HostName",
    "fleet_policy.balloons.*.team": "must name one of the inventory's teams (roles/fleet_policy/"
    "checks.py), a HostName",
    "fleet_policy.dcgm_keep_metrics": "a regular expression that templates/monitoring/prometheus."
    "yml.j2 writes with tojson (roles/fleet_policy/files.py:metric_rules)",
    "monitoring.drop_metrics": "a regular expression that templates/monitoring/prometheus.yml.j2 "
    "writes with tojson (roles/monitoring/files.py)",
    "shared_fs.existing.key_file": "a file on the controller (roles/shared_fs/files.py:"
    "client_files reads it there): only its content, a file of its own, reaches the host",
    "ssh.bastion": "the controller's ssh_config (toolkit/ssh.py:ssh_config_text): JumpHost refuses "
    "spaces and newlines, and ssh_config's HostName runs no shell",
}

# Fields read where they are used and found to reach a host unchecked, not fixed yet: each is
# a finding (issue 47 item 14). Listing one here is no excuse: the test below fails once the
# field is checked, so that the line goes too.
UNCHECKED: dict[str, str] = {}


@dataclass(frozen=True)
class StringField:
    """One string an inventory can set: its model, its field there and how it is held (each
    step: a list's item, a dict's key or a dict's value)."""

    name: str
    model: type[BaseModel]
    field: str
    steps: tuple[str, ...]

    def value(self, text: str) -> dict[str, Any]:
        held: Any = text
        for step in reversed(self.steps):
            held = [held] if step == "item" else {held: "a"} if step == "key" else {"a": held}
        return {self.field: held}

    def default(self) -> list[str]:
        """The model's own default for this string, where it has one."""
        info = self.model.model_fields[self.field]
        held = None if info.is_required() else info.get_default(call_default_factory=True)
        for step in self.steps:
            if not held:
                return []
            held = next(iter(held)) if step in ("item", "key") else next(iter(held.values()))
        return [held] if isinstance(held, str) else []

    def refused_by_its_type(self) -> bool:
        """Every hostile shape is refused, and a well-formed value passes (the control)."""
        controls = [*PLAIN, *self.default(), CONTROLS.get(self.name, "")]
        return all(self.refuses(shape) for shape in SHAPES) and not all(
            self.refuses(control) for control in controls
        )

    def refuses(self, text: str) -> bool:
        try:
            self.model.model_validate(self.value(text))
        except ValidationError as exc:
            for error in exc.errors():
                at_key = "[key]" in error["loc"]
                if error["loc"][:1] == (self.field,) and at_key == (self.steps[-1:] == ("key",)):
                    return True
        return False


def _string_fields(
    tp: Any, name: str, model: type[BaseModel], field: str, steps: tuple[str, ...]
) -> Iterator[StringField]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        yield from _string_fields(args[0], name, model, field, steps)
    elif origin in (Union, types.UnionType):
        for arg in args:
            yield from _string_fields(arg, name, model, field, steps)
    elif origin in (list, tuple, set, frozenset):
        for arg in args:
            if arg is not Ellipsis:
                yield from _string_fields(arg, name, model, field, (*steps, "item"))
    elif origin is dict:
        yield from _string_fields(args[0], f"{name}.<key>", model, field, (*steps, "key"))
        yield from _string_fields(args[1], f"{name}.*", model, field, (*steps, "value"))
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        for sub, info in tp.model_fields.items():
            yield from _string_fields(info.annotation, f"{name}.{sub}".lstrip("."), tp, sub, ())
    elif tp in (str, Any) or (isinstance(tp, type) and issubclass(tp, PurePath)):
        yield StringField(name, model, field, steps)
    # Left: Literal, Enum, bool, int, float, None and the ipaddress types, which hold no text.


def every_string_field() -> list[StringField]:
    """The Cluster's strings, then each role's as engine/context.py validates them."""
    models = {"": Cluster, **ROLE_CONFIGS}
    return [
        found
        for prefix, model in models.items()
        for found in _string_fields(model, prefix, model, "", ())
    ]


def _tested(key: str) -> str:
    """A table's key as the field's name: without a list's index (volumes.0.disks)."""
    return ".".join(part for part in key.split(".") if not part.isdigit())


# The tables' keys that set a dict's key rather than its value.
SETS_A_KEY = {"base.extra_hosts", "kernel.sysctls"}
# And those that set a dict's value.
SETS_A_VALUE = {"container_runtime.registry_mirrors"}
TABLES = {
    f"{_tested(key)}.<key>"
    if key in SETS_A_KEY
    else f"{_tested(key)}.*"
    if key in SETS_A_VALUE
    else _tested(key)
    for key in [*FIELDS, *URL_OR_IMAGE, *SPACED]
} | {
    "etcd.backup_schedule",
    "base.authorized_keys",
    "kernel.sysctls.*",
    "ssh.key",
    "ssh.known_hosts",
}


def test_every_string_field_reaching_a_host_is_checked_or_declared():
    fields = every_string_field()
    unchecked = sorted(
        found.name
        for found in fields
        if found.name not in TABLES
        and found.name not in DECLARED
        and not found.refused_by_its_type()
    )
    assert unchecked == sorted(UNCHECKED), "\n".join(
        [f"{name}: send it hostile values in a table, give it a grammar or declare it"
         for name in unchecked if name not in UNCHECKED]
        + [f"{name}: checked now, remove it from UNCHECKED" for name in UNCHECKED
           if name not in unchecked]
    )  # fmt: skip


def test_each_declared_field_exists():
    """A field renamed or removed must not leave its declaration behind."""
    names = {found.name for found in every_string_field()}
    assert sorted(set(DECLARED) - names) == []
