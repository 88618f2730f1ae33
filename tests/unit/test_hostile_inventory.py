"""Inventory strings that reach root shells or admin-applied YAML are checked by their grammar
at load: each hostile value (a command separator, a substitution, a newline, a parent folder,
backticks) is refused with exit 2 and one line naming its key, and a reserved namespace is
refused for the Jobs."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app

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
