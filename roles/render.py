"""Render every managed file of every host from the templates, with no connection to any host."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inventory.model import LoadedCluster
from roles.context import cluster_files, host_contexts, host_files
from roles.spec import ManagedFile

CLUSTER_DIR = "_cluster"  # cluster-wide files (Kubernetes manifests) under OUT/_cluster/


@dataclass
class RenderResult:
    out: Path
    hosts: int = 0
    files: int = 0
    per_host: dict[str, list[str]] = field(default_factory=dict)


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
        target.write_text(content)
        if isinstance(item, ManagedFile):
            target.chmod(int(item.mode, 8))
    result.hosts = len(result.per_host)
    result.files = len(planned)
    return result
