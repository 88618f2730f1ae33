"""Render every managed file of every host from the templates, with no connection to any host."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2

from inventory.model import LoadedCluster
from inventory.topology import Topology, build_topology
from roles.config import role_settings
from roles.registry import ROLE_CONFIGS
from roles.spec import HostContext, ManagedFile
from roles.statefiles import PLACEHOLDER, write_atomically

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
CLUSTER_DIR = "_cluster"  # cluster-wide files (Kubernetes manifests) under OUT/_cluster/


@cache
def environment() -> jinja2.Environment:
    # StrictUndefined: a missing variable is an error, never an empty string in a config file.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(name: str, **context: object) -> str:
    return environment().get_template(name).render(**context)


def host_contexts(loaded: LoadedCluster) -> list[HostContext]:
    topology = build_topology(loaded.cluster)
    return [host_context(loaded, name, topology) for name in loaded.cluster.hosts]


def host_context(loaded: LoadedCluster, name: str, topology: Topology | None = None) -> HostContext:
    settings = {role: role_settings(loaded.cluster, name, role) for role in ROLE_CONFIGS}
    return HostContext(loaded, topology or build_topology(loaded.cluster), name, settings)


def host_files(ctx: HostContext) -> list[ManagedFile]:
    from roles.phases import PHASES

    files: list[ManagedFile] = []
    for phase in PHASES:
        if phase.applies_to(ctx.host.groups) and phase.files is not None:
            files.extend(phase.files(ctx))
    return files


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    from roles.phases import CLUSTER_FILES

    rendered: dict[str, str] = {}
    for producer in CLUSTER_FILES:
        rendered.update(producer(loaded))
    return rendered


@dataclass
class RenderResult:
    out: Path
    hosts: int = 0
    files: int = 0
    per_host: dict[str, list[str]] = field(default_factory=dict)
    # Files holding a placeholder for a secret only apply generates (no state yet).
    placeholders: list[Path] = field(default_factory=list)


def render_cluster(loaded: LoadedCluster, out: Path) -> RenderResult:
    """Render everything in memory first, then write: a template error writes nothing."""
    planned: list[tuple[Path, ManagedFile | str]] = []
    result = RenderResult(out=out)
    for ctx in host_contexts(loaded):
        files = host_files(ctx)
        result.per_host[ctx.name] = [f.path for f in files]
        planned += [(out / ctx.name / f.path.lstrip("/"), f) for f in files]
    planned += [(out / CLUSTER_DIR / rel, text) for rel, text in cluster_files(loaded).items()]
    for target, item in planned:
        target.parent.mkdir(parents=True, exist_ok=True)
        content = item if isinstance(item, str) else item.content
        # Created with its final mode, never wider first; a secret is the operator's alone.
        mode = 0o644 if isinstance(item, str) else int(item.mode, 8)
        if isinstance(item, ManagedFile) and item.secret:
            mode = 0o600
        write_atomically(target, content.encode(), mode, durable=False)
        if PLACEHOLDER in content:
            result.placeholders.append(target)
    result.hosts = len(result.per_host)
    result.files = len(planned)
    return result
