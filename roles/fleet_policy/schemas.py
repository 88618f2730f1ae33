"""Offline schema validation of rendered Kubernetes objects, for the cluster's own version.

Built-in kinds are checked against the official OpenAPI schemas that `kubernetes-validate`
bundles (strict: an unknown field is an error, as `kubectl apply --validate=strict` makes it);
custom resources against the openAPIV3Schema of a CRD rendered beside them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

Schema = dict[str, Any]


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML file (comments and empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name', '?')}"


def _strict(schema: Schema) -> Schema:
    """Close every object with declared properties, as strict field validation does."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            closable = "properties" in node and "additionalProperties" not in node
            if closable and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for item in node:
                close(item)

    close(schema)
    return schema


def crd_schemas(objects: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Schema]:
    """(apiVersion, kind) -> schema, for every served version of every CRD given."""
    schemas: dict[tuple[str, str], Schema] = {}
    for obj in objects:
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        spec = obj["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                api_version = f"{spec['group']}/{version['name']}"
                schema = version["schema"]["openAPIV3Schema"]
                schemas[(api_version, spec["names"]["kind"])] = _strict(schema)
    return schemas


def validate_objects(
    objects: Iterable[dict[str, Any]],
    kubernetes_version: str,
    crds: dict[tuple[str, str], Schema] | None = None,
) -> list[str]:
    """One line per invalid object (empty when all are valid); unknown kinds are errors too."""
    crds = crds or {}
    problems: list[str] = []
    for obj in objects:
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        try:
            if key in crds:
                jsonschema.validate(obj, crds[key])
            else:
                kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(part) for part in exc.absolute_path) or "(top)"
            problems.append(f"{name_of(obj)}: {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{name_of(obj)}: no schema for {key[0]} {key[1]}")
    return problems


def schema_version(kubernetes_version: str) -> str:
    """The schema set used for a cluster version: its own minor (the library has 1.28-1.37)."""
    return kubernetes_validate.utils.major_minor(kubernetes_version)
