"""Render every managed file of every host from the templates, with no connection to any host."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.context import cluster_files, host_contexts, host_files
from inventory.model import LoadedCluster
from toolkit.spec import ManagedFile
from toolkit.statefiles import PLACEHOLDER, write_atomically

CLUSTER_DIR = "_cluster"  # cluster-wide files (Kubernetes manifests) under OUT/_cluster/


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
