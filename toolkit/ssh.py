"""The one place that builds SSH settings (user, port, key, known_hosts, bastion) for all three
SSH users: pyinfra's host data, OpenSSH command lines and ssh_config text, and paramiko clients.

Host keys are always checked against the inventory's known_hosts, the bastion's included: an
unknown or changed key is refused on every path, never accepted or added.
"""

from __future__ import annotations

import atexit
import functools
import os
import shlex
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

    from inventory.model import LoadedCluster

# The ssh_config entry that names the bastion: nodes jump through this alias, and the alias
# matches no node, so the jump host never matches its own ProxyJump (no recursion).
BASTION_ALIAS = "gpuinfra-bastion"
CONNECT_TIMEOUT_S = 10
SSH_CONFIG_FILE = "ssh_config"


@dataclass(frozen=True)
class Bastion:
    host: str
    port: int
    user: str

    @classmethod
    def parse(cls, spec: str, default_user: str) -> Bastion:
        """`user@host[:port]`, `host[:port]`: the user defaults to the cluster's ssh user."""
        user, _, hostport = spec.rpartition("@")
        host, _, port = hostport.partition(":")
        if not host or (port and not port.isdigit()) or not 0 < int(port or 22) < 65536:
            raise ValueError(f"ssh.bastion: {spec!r} is not user@host[:port]")
        return cls(host=host, port=int(port or 22), user=user or default_user)


@dataclass(frozen=True)
class SSHSettings:
    """How the controller reaches every host of one cluster."""

    user: str
    port: int
    key: Path | None  # None: the agent and the user's default keys
    known_hosts: Path  # resolved; strict checking is always on
    bastion: Bastion | None = None
    connect_timeout: int = CONNECT_TIMEOUT_S

    @classmethod
    def from_cluster(cls, loaded: LoadedCluster, connect_timeout: int = CONNECT_TIMEOUT_S):
        ssh = loaded.cluster.ssh
        return cls(
            user=ssh.user,
            port=ssh.port,
            key=loaded.resolve(ssh.key) if ssh.key is not None else None,
            known_hosts=loaded.resolve(ssh.known_hosts),
            bastion=Bastion.parse(ssh.bastion, ssh.user) if ssh.bastion else None,
            connect_timeout=connect_timeout,
        )

    # pyinfra ----------------------------------------------------------------------------

    def pyinfra_data(self, ssh_config_file: Path | None = None) -> dict[str, object]:
        """pyinfra's host data for every host. With a bastion, `ssh_config_file` must hold
        `ssh_config_text`: pyinfra reaches the jump host through its ssh_config entry."""
        data: dict[str, object] = {
            "ssh_user": self.user,
            "ssh_port": self.port,
            "ssh_known_hosts_file": str(self.known_hosts),
            # Never trust an unknown host key: a changed key means a different machine.
            "ssh_strict_host_key_checking": "yes",
            "ssh_connect_retries": 0,
            "ssh_paramiko_connect_kwargs": {
                "timeout": self.connect_timeout,
                "banner_timeout": self.connect_timeout,
            },
        }
        if self.key is not None:
            data.update(ssh_key=str(self.key), ssh_allow_agent=False, ssh_look_for_keys=False)
        if self.bastion is not None:
            if ssh_config_file is None:
                raise ValueError("a cluster with a bastion needs its ssh_config file")
            data["ssh_config_file"] = str(ssh_config_file)
        return data

    # OpenSSH ----------------------------------------------------------------------------

    def _common_options(self) -> list[str]:
        # -F: no ~/.ssh/config nor /etc/ssh/ssh_config, whose HostName, ProxyJump or Match
        # blocks would send a command elsewhere than pyinfra's connections go (paramiko reads
        # neither); everything the connection needs is on the command line.
        options = [
            "-F", os.devnull,
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", f"ConnectTimeout={self.connect_timeout}",
        ]  # fmt: skip
        if self.key is not None:
            options += ["-i", str(self.key), "-o", "IdentitiesOnly=yes"]
        return options

    def bastion_argv(self, *, batch: bool = True) -> list[str]:
        """`ssh` to the bastion itself, its key checked against the inventory's known_hosts."""
        if self.bastion is None:
            raise ValueError("the cluster has no bastion")
        argv = ["ssh", *self._common_options(), "-p", str(self.bastion.port)]
        argv += ["-l", self.bastion.user]
        if batch:
            argv += ["-o", "BatchMode=yes"]
        return [*argv, self.bastion.host]

    def argv(self, address: str, *, batch: bool = True) -> list[str]:
        """argv for `ssh` to one host; append the remote command to it. Through the bastion,
        the hop is an `ssh -W` that checks the bastion's key with the same known_hosts (a
        ProxyCommand: no ssh_config file to write, so read-only callers write nothing)."""
        argv = ["ssh", *self._common_options(), "-p", str(self.port), "-l", self.user]
        if batch:
            argv += ["-o", "BatchMode=yes"]
        if self.bastion is not None:
            hop = [*self.bastion_argv(batch=True)[:-1], "-W", "%h:%p", self.bastion.host]
            # ProxyCommand expands %-tokens: a literal % in a path must be doubled.
            command = " ".join(
                part if part == "%h:%p" else shlex.quote(part).replace("%", "%%") for part in hop
            )
            argv += ["-o", f"ProxyCommand={command}"]
        return [*argv, address]

    def ssh_config_text(self, addresses: list[str]) -> str:
        """ssh_config for the cluster (pyinfra reads it; `ssh -F` too): the bastion under an
        alias of its own, checked strictly against the inventory's known_hosts, and each node
        address jumping through that alias."""
        if self.bastion is None:
            return ""
        identity = [f"    IdentityFile {_config_value(self.key)}", "    IdentitiesOnly yes"]
        common = [
            "    StrictHostKeyChecking yes",
            f"    UserKnownHostsFile {_config_value(self.known_hosts)}",
            f"    ConnectTimeout {self.connect_timeout}",
            *(identity if self.key is not None else []),
        ]
        lines = [
            "# Managed by gpuinfra: the bastion has an entry of its own, so it never matches the",
            "# nodes' ProxyJump, and its host key is checked against the inventory's known_hosts.",
            f"Host {BASTION_ALIAS}",
            f"    HostName {self.bastion.host}",
            f"    Port {self.bastion.port}",
            f"    User {self.bastion.user}",
            *common,
            "",
            f"Host {' '.join(addresses)}",
            # The port in the jump spec too: pyinfra 3.10 passes a port read from ssh_config
            # on as a string, and paramiko then looks the hop's key up as "[host]:22".
            f"    ProxyJump {BASTION_ALIAS}:{self.bastion.port}",
            f"    Port {self.port}",
            f"    User {self.user}",
            *common,
        ]
        return "\n".join(lines) + "\n"

    def write_ssh_config(self, addresses: list[str], folder: Path | None) -> Path | None:
        """Write `ssh_config_text` atomically, 0600 from creation, into `folder` (apply: the
        inventory's .state/); with no folder into a private temporary one removed at exit
        (read-only commands write no state). None when there is no bastion."""
        if self.bastion is None:
            return None
        if folder is None:
            folder = Path(tempfile.mkdtemp(prefix="gpuinfra-ssh-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / SSH_CONFIG_FILE
        staged = folder / f".{SSH_CONFIG_FILE}.{os.getpid()}.partial"
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(self.ssh_config_text(addresses))
        os.replace(staged, path)
        return path

    # paramiko ---------------------------------------------------------------------------

    def _key_kwargs(self) -> dict[str, object]:
        key = str(self.key) if self.key is not None else None
        return {"key_filename": key, "look_for_keys": key is None, "allow_agent": key is None}

    def bastion_problem(self) -> str | None:
        """Why the bastion cannot be used (its host key refused, unreachable), or None.

        Checked once before the nodes are tried, so that a refused bastion key is reported as
        such for every host behind it (pyinfra 3.10 fails with an AttributeError when a
        ProxyJump hop's key is refused). Nothing but the key exchange and login happens."""
        if self.bastion is None:
            return None
        import paramiko

        where = f"bastion {self.bastion.host}:{self.bastion.port}"
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                hostname=self.bastion.host,
                port=self.bastion.port,
                username=self.bastion.user,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                **self._key_kwargs(),
            )
        except paramiko.BadHostKeyException:
            return (
                f"{where}: host key refused: it differs from the one in {self.known_hosts} "
                "(another machine, or someone in between); no host behind it was tried"
            )
        except paramiko.SSHException as exc:
            return f"{where}: {exc} (host key checked against {self.known_hosts})"
        except OSError as exc:
            return f"{where}: could not connect: {exc}"
        finally:
            client.close()
        return None

    def connect(self, address: str) -> paramiko.SSHClient:
        """A connected paramiko client to one host that refuses unknown and changed host keys,
        through the bastion (its own key checked the same way) over a direct-tcpip channel."""
        import paramiko

        sock = None
        hop = None
        if self.bastion is not None:
            hop = _JumpedClient(None)
            try:
                hop.load_host_keys(str(self.known_hosts))
                hop.set_missing_host_key_policy(paramiko.RejectPolicy())
                hop.connect(
                    hostname=self.bastion.host,
                    port=self.bastion.port,
                    username=self.bastion.user,
                    timeout=self.connect_timeout,
                    **self._key_kwargs(),
                )
                transport = hop.get_transport()
                assert transport is not None
                sock = transport.open_channel(
                    "direct-tcpip", (address, self.port), ("127.0.0.1", 0),
                    timeout=self.connect_timeout,
                )  # fmt: skip
            except BaseException:
                hop.close()
                raise
        client = _JumpedClient(hop)
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                hostname=address,
                port=self.port,
                username=self.user,
                timeout=self.connect_timeout,
                sock=sock,
                **self._key_kwargs(),
            )
        except BaseException:
            client.close()
            raise
        return client


@functools.cache
def _jumped_client_class():
    """paramiko is imported only by what connects with it (the drift fast path uses OpenSSH)."""
    import paramiko

    class JumpedClient(paramiko.SSHClient):
        """A client that closes its bastion connection with its own."""

        def __init__(self, hop: paramiko.SSHClient | None) -> None:
            super().__init__()
            self._hop = hop

        def close(self) -> None:
            super().close()
            if self._hop is not None:
                self._hop.close()

    return JumpedClient


def _JumpedClient(hop):  # noqa: N802 (constructs the class above)
    return _jumped_client_class()(hop)


def _config_value(path: Path | None) -> str:
    text = str(path)
    return f'"{text}"' if any(c.isspace() for c in text) else text


# id(loaded) -> connect timeout -> its settings; an entry goes when its cluster object does, so
# an id that Python hands out again never finds another cluster's settings.
_BUILT: dict[int, dict[int, SSHSettings]] = {}


def ssh_settings(loaded: LoadedCluster, connect_timeout: int = CONNECT_TIMEOUT_S) -> SSHSettings:
    """The cluster's SSH settings, built once per loaded cluster and timeout: every SSH user of
    a run (pyinfra's inventory, the drift probes, day-2 commands) shares them, so a key or
    known_hosts path is resolved once and the same way for all of them."""
    built = _BUILT.get(id(loaded))
    if built is None:
        built = _BUILT[id(loaded)] = {}
        weakref.finalize(loaded, _BUILT.pop, id(loaded), None)
    if connect_timeout not in built:
        built[connect_timeout] = SSHSettings.from_cluster(loaded, connect_timeout)
    return built[connect_timeout]


def ssh_argv(loaded: LoadedCluster, host: str, *, batch: bool = True) -> list[str]:
    """argv for `ssh` to one inventory host; append the remote command to it.

    Strict host-key checking against the cluster's known_hosts file is never turned off: an
    unknown or changed host key makes ssh refuse, and the caller reports that host as failed.
    """
    address = str(loaded.cluster.hosts[host].address)
    return ssh_settings(loaded).argv(address, batch=batch)
