"""The same declared state for four engines: a flat pyinfra deploy, an Ansible playbook and the
floor (one ssh command per host, benchmarks/floor.py) written from what `gpuinfra render`
produced, next to gpuinfra's own roles.

"Same state" covers, per host: every managed file of every phase that targets the host (the
rendered content, its mode, owner and group, its parent directory present) and the `packages`
list of every such role's config (installed, no recommends). gpuinfra's roles check more than
that (the base role also points sources.list at the managed sources, removes the
distribution's source files, checks the live hostname and the chrony service and evaluates its
restart handlers); the three others check exactly the list above.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from engine.context import host_contexts
from engine.registry import PHASES
from inventory.model import LoadedCluster
from toolkit.ssh import ssh_settings


@dataclass(frozen=True)
class DeclaredState:
    """Per host: files as (path on the host, rendered copy, mode, user, group); package lists."""

    files: dict[str, list[dict[str, str]]]
    packages: dict[str, list[list[str]]]

    @property
    def operations_per_host(self) -> dict[str, int]:
        return {h: len(self.files[h]) + len(self.packages[h]) for h in self.files}


def declared_state(loaded: LoadedCluster, render_dir: Path) -> DeclaredState:
    """Read the state from a `gpuinfra render` folder (contents) and the phases (metadata)."""
    files: dict[str, list[dict[str, str]]] = {}
    packages: dict[str, list[list[str]]] = {}
    for ctx in host_contexts(loaded):
        files[ctx.name], packages[ctx.name] = [], []
        roles_seen: set[str] = set()  # a role may have several phases (dns server, dns client)
        for phase in PHASES:
            if not phase.applies_to(ctx.host.groups, ctx.cluster):
                continue
            for managed in phase.files(ctx) if phase.files else []:
                rendered = render_dir / ctx.name / managed.path.lstrip("/")
                if not rendered.is_file():
                    raise FileNotFoundError(f"{rendered}: run `gpuinfra render` first")
                files[ctx.name].append(
                    {
                        "path": managed.path,
                        "src": str(rendered.resolve()),
                        "mode": managed.mode,
                        "user": managed.user,
                        "group": managed.group,
                    }
                )
            role_packages = getattr(ctx.settings[phase.role], "packages", None)
            if role_packages and phase.role not in roles_seen:
                packages[ctx.name].append(list(role_packages))
            roles_seen.add(phase.role)
    return DeclaredState(files, packages)


PYINFRA_DEPLOY = '''\
"""Flat pyinfra deploy written by benchmarks/engines.py: the files and packages of
`gpuinfra render`, nothing else."""

import json

from pyinfra import host
from pyinfra.operations import apt, files

STATE = json.load(open({state!r}))

for managed in host.loop(STATE["files"][host.name]):
    files.put(
        name="Write " + managed["path"],
        src=managed["src"],
        dest=managed["path"],
        user=managed["user"],
        group=managed["group"],
        mode=managed["mode"],
        create_remote_dir=True,
    )

for packages in host.loop(STATE["packages"][host.name]):
    apt.packages(name="Install packages", packages=packages, no_recommends=True)
'''

ANSIBLE_PLAYBOOK = [
    {
        "name": "Same declared state as gpuinfra render",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Write managed files",
                "ansible.builtin.copy": {
                    "src": "{{ item.src }}",
                    "dest": "{{ item.path }}",
                    "mode": "{{ item.mode }}",
                    "owner": "{{ item.user }}",
                    "group": "{{ item.group }}",
                },
                "loop": "{{ managed_files }}",
                "loop_control": {"label": "{{ item.path }}"},
            },
            {
                "name": "Install packages",
                "ansible.builtin.apt": {
                    "name": "{{ item }}",
                    "state": "present",
                    "install_recommends": False,
                },
                "loop": "{{ package_sets }}",
            },
        ],
    }
]


@dataclass(frozen=True)
class EngineFiles:
    pyinfra_inventory: Path
    pyinfra_deploy: Path
    ansible_cfg: Path
    ansible_inventory: Path
    ansible_playbook: Path
    state: Path  # the declared state as JSON (pyinfra's deploy and the floor read it)
    floor_hosts: Path  # addresses and SSH settings for benchmarks/floor.py


def write_engines(loaded: LoadedCluster, state: DeclaredState, out: Path) -> EngineFiles:
    """Write both engines' inputs under `out` (pyinfra/, ansible/)."""
    cluster = loaded.cluster
    ssh = ssh_settings(loaded)
    key = str(ssh.key) if ssh.key is not None else None
    known_hosts = str(ssh.known_hosts)
    hosts = list(cluster.hosts)

    pyinfra_dir = out / "pyinfra"
    pyinfra_dir.mkdir(parents=True, exist_ok=True)
    state_file = pyinfra_dir / "state.json"
    state_file.write_text(json.dumps({"files": state.files, "packages": state.packages}))
    host_data = {
        "ssh_user": ssh.user,
        "ssh_port": ssh.port,
        "ssh_known_hosts_file": known_hosts,
        "ssh_strict_host_key_checking": "yes",
        **({"ssh_key": key, "ssh_allow_agent": False, "ssh_look_for_keys": False} if key else {}),
    }
    entries = [(name, {"ssh_hostname": str(cluster.hosts[name].address)}) for name in hosts]
    inventory = pyinfra_dir / "inventory.py"
    inventory.write_text(
        "# Written by benchmarks/engines.py from the cluster inventory.\n"
        f"hosts = ({entries!r}, {host_data!r})\n"
    )
    deploy = pyinfra_dir / "deploy.py"
    deploy.write_text(PYINFRA_DEPLOY.format(state=str(state_file.resolve())))

    ansible_dir = out / "ansible"
    ansible_dir.mkdir(parents=True, exist_ok=True)
    ansible_inventory = ansible_dir / "inventory.yml"
    ansible_inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_user": ssh.user,
                        "ansible_port": ssh.port,
                        **({"ansible_ssh_private_key_file": key} if key else {}),
                        "ansible_python_interpreter": "/usr/bin/python3",
                    },
                    "hosts": {
                        name: {
                            "ansible_host": str(cluster.hosts[name].address),
                            "managed_files": state.files[name],
                            "package_sets": state.packages[name],
                        }
                        for name in hosts
                    },
                }
            },
            sort_keys=False,
        )
    )
    playbook = ansible_dir / "playbook.yml"
    playbook.write_text(yaml.safe_dump(ANSIBLE_PLAYBOOK, sort_keys=False))
    cfg = ansible_dir / "ansible.cfg"
    # forks = hosts: every host at once, as gpuinfra and pyinfra work; host keys checked against
    # the lab's known_hosts, as the other two do; pipelining and a control master per host are
    # Ansible's fastest documented settings; no fact gathering (neither task needs facts).
    cfg.write_text(
        textwrap.dedent(
            f"""\
            [defaults]
            inventory = {ansible_inventory.resolve()}
            forks = {len(hosts)}
            host_key_checking = True
            gathering = explicit
            retry_files_enabled = False
            interpreter_python = /usr/bin/python3

            [ssh_connection]
            pipelining = True
            ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts}
            """  # noqa: E501
        )
    )
    floor_dir = out / "floor"
    floor_dir.mkdir(parents=True, exist_ok=True)
    floor_hosts = floor_dir / "hosts.json"
    floor_hosts.write_text(
        json.dumps(
            {
                "addresses": {name: str(cluster.hosts[name].address) for name in hosts},
                "ssh": {
                    "user": ssh.user,
                    "port": ssh.port,
                    "key": key,
                    "known_hosts": known_hosts,
                },
            }
        )
    )
    return EngineFiles(
        inventory, deploy, cfg, ansible_inventory, playbook, state_file.resolve(), floor_hosts
    )


def write_probes(loaded: LoadedCluster, floor_hosts: Path) -> Path:
    """Inputs of the floor-probe engine (floor.py --probes): each host's probe as `gpuinfra
    drift` sends it, written from the host's converged record, with the digest of its answer.
    The answer is taken once here and checked command by command against the record as drift
    checks it: a host that does not answer as recorded stops the benchmark (the lab is not the
    converged one the records say)."""
    from benchmarks.floor import answer_digest, ask
    from engine import fingerprint

    hosts = json.loads(floor_hosts.read_text())
    marker = "gpuinfra-fingerprint-benchmark"
    records, commands, scripts = {}, {}, {}
    for name in hosts["addresses"]:
        records[name] = fingerprint.load_record(loaded.state_dir, name)
        if records[name] is None:
            raise RuntimeError(f"{name}: no converged record (apply first)")
        commands[name] = [command for command, _, _ in records[name].commands]
        scripts[name] = fingerprint.probe_script(commands[name], marker)
    answers = ask(hosts, {name: ("sh -s", script.encode()) for name, script in scripts.items()})
    probes = {}
    for name, (code, output, errors) in answers.items():
        answer = fingerprint.read_probe(output, marker, commands[name])
        found = fingerprint.differences(records[name], answer)
        if code != 0 or found:
            raise RuntimeError(f"{name}: the probe does not answer as recorded: {found or errors}")
        probes[name] = {"script": scripts[name], "digest": answer_digest(output)}
    path = floor_hosts.parent / "probes.json"
    path.write_text(json.dumps(probes))
    return path
