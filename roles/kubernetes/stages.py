"""The cluster's Kubernetes objects (every role's _cluster/kubernetes/ files but Calico's), in
apply stages: CRDs, then namespaces, then everything else, each a file on every control-plane
node, applied server-side from the first one (operations.cluster_objects_applied)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from roles.kubernetes.cni import CALICO_PREFIX
from roles.kubernetes.settings import CONFIG_DIR
from toolkit.spec import HostContext, ManagedFile

CLUSTER_OBJECTS_DIR = f"{CONFIG_DIR}/cluster"
# Where the Kubernetes objects of every role are under _cluster/; Calico's are applied by the
# Calico step instead (cni.CALICO_PREFIX).
OBJECTS_PREFIX = "kubernetes/"
# Server-side apply records this manager as the owner of every field the role sets; a field
# another manager owns is taken over (--force-conflicts): the inventory is the source of truth.
FIELD_MANAGER = "gpuinfra"


@dataclass(frozen=True)
class ApplyStage:
    """One file of cluster objects, applied in name order: CRDs before the objects that use
    them, namespaces before what lives in them."""

    path: str
    content: str
    kinds: str  # what the stage holds, for its header
    secret: bool = False
    crds: bool = False  # waited for (condition Established) before the next stage


STAGES = (
    ("00-crds.yaml", "custom resource definitions", {"CustomResourceDefinition"}),
    ("10-namespaces.yaml", "namespaces", {"Namespace"}),
    ("20-objects.yaml", "objects", None),  # every other kind
)


def cluster_objects(rendered: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """(_cluster/ path, object) of every Kubernetes object the kubernetes role applies, in path
    and document order."""
    return [
        (path, obj)
        for path in sorted(rendered)
        if path.startswith(OBJECTS_PREFIX) and not path.startswith(CALICO_PREFIX)
        for obj in yaml.safe_load_all(rendered[path])
        if obj
    ]


def apply_stages(rendered: Mapping[str, str]) -> list[ApplyStage]:
    """The objects of `rendered` (every role's cluster files) split into the apply stages, each
    object under a comment naming the _cluster/ file it comes from; empty stages left out."""
    staged: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in STAGES]
    for path, obj in cluster_objects(rendered):
        first = next(
            i for i, (_, _, kinds) in enumerate(STAGES) if kinds is None or obj.get("kind") in kinds
        )
        staged[first].append((path, obj))
    stages = []
    for (name, kinds, _), taken in zip(STAGES, staged, strict=True):
        if not taken:
            continue
        header = (
            f"# Managed by gpuinfra: the cluster's {kinds}, applied with `kubectl apply "
            f"--server-side --field-manager={FIELD_MANAGER}` from the first control-plane node,\n"
            f"# in file name order ({CLUSTER_OBJECTS_DIR}). Rendered under _cluster/ by every "
            "role; edit the inventory, not this file.\n"
        )
        documents = [
            f"# from _cluster/{path}\n" + yaml.safe_dump(obj, sort_keys=False, width=1000)
            for path, obj in taken
        ]
        stages.append(
            ApplyStage(
                path=f"{CLUSTER_OBJECTS_DIR}/{name}",
                content=header + "---\n".join(documents),
                kinds=kinds,
                secret=any(obj.get("kind") == "Secret" for _, obj in taken),
                crds=name.startswith("00-"),
            )
        )
    return stages


def stage_files(ctx: HostContext) -> list[ManagedFile]:
    """The stages as files, on every control-plane node (the same paths on each, as pyinfra
    needs); applied from the first one only."""
    files = []
    for stage in apply_stages(ctx.cluster_files()):
        managed = ManagedFile("kubernetes", stage.path, stage.content, mode="0600")
        files.append(replace(managed, secret=stage.secret))
    return files
