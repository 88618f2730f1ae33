"""Build a validated cluster from parsed data: the schema, the cluster rules, and the roles'
checks handed in by the layer above; every error names the file, the line and the key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from inventory import paths
from inventory.errors import InventoryError, InventoryInvalid
from inventory.model import Cluster, LoadedCluster
from inventory.validate import check_cluster

# What the layer above adds to a load (engine/context.py): each host's typed role settings and
# the problems found while merging and checking them, as (key path, message).
RoleSettings = dict[str, dict[str, Any]]
# libyaml's parser when PyYAML was built with it (Debian's and the wheels are), else pure Python.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
RoleChecks = Callable[[LoadedCluster], tuple[RoleSettings, Iterable[tuple[str, str]]]]


def load_cluster_file(path: Path, role_checks: RoleChecks | None = None) -> LoadedCluster:
    text = _read(path)
    data, lines = parse_yaml(path, text)
    return build(
        data,
        source=path,
        base_dir=path.parent,
        lines=lines,
        role_checks=role_checks,
        text_digest=paths.text_digest(text),
    )


def build(
    data: Any,
    *,
    source: Path,
    base_dir: Path,
    lines: dict[tuple[str, ...], int] | None = None,
    role_checks: RoleChecks | None = None,
    text_digest: str | None = None,
) -> LoadedCluster:
    """Validate raw cluster data (from YAML or an import) into a LoadedCluster."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise InventoryInvalid([InventoryError(source, "", "expected a mapping at the top level")])
    try:
        cluster = Cluster.model_validate(data)
    except ValidationError as exc:
        raise InventoryInvalid(_pydantic_errors(exc, source, lines)) from None
    loaded = LoadedCluster(
        cluster=cluster, source=source, base_dir=base_dir, lines=lines, text_digest=text_digest
    )
    problems = list(check_cluster(loaded))
    if role_checks is not None:
        settings, role_problems = role_checks(loaded)
        problems += role_problems
        loaded = loaded.model_copy(update={"settings": settings})
    errors = [
        InventoryError(source, key, message, _line_of(lines, key)) for key, message in problems
    ]
    if errors:
        raise InventoryInvalid(errors)
    return loaded


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise InventoryInvalid([InventoryError(path, "", f"cannot read: {exc.strerror}")]) from None


def parse_yaml(path: Path, text: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """Parse YAML once, refusing duplicate keys, and index the line of every key path.

    One pass of libyaml's parser builds the node tree; the data is constructed from that same
    tree and the lines are read off it. (Parsing twice in pure Python, once for the nodes and
    once for the data, took a minute for a 7,500-host inventory.)
    """
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or str(exc)
        raise InventoryInvalid(
            [InventoryError(path, "", f"malformed YAML: {problem}", line)]
        ) from None
    finally:
        loader.dispose()
    lines: dict[tuple[str, ...], int] = {}
    errors: list[InventoryError] = []
    if node is not None:
        _index(node, (), lines, errors, path)
    if errors:
        raise InventoryInvalid(errors)
    return data, lines


def _index(node, prefix, lines, errors, path) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            keypath = prefix + (key,)
            if key in seen:
                errors.append(
                    InventoryError(
                        path, ".".join(keypath), f"duplicate key (first at line {seen[key]})", line
                    )
                )
                continue
            seen[key] = line
            lines[keypath] = line
            _index(value_node, keypath, lines, errors, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            keypath = prefix + (str(i),)
            lines[keypath] = item.start_mark.line + 1
            _index(item, keypath, lines, errors, path)


def _line_of(lines: dict[tuple[str, ...], int], key: str) -> int | None:
    parts = tuple(key.split(".")) if key else ()
    while parts:
        if parts in lines:
            return lines[parts]
        parts = parts[:-1]
    return None


def _pydantic_errors(exc: ValidationError, source: Path, lines) -> list[InventoryError]:
    errors = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        # pydantic reports dict keys as "[key]" and unions with type tags; keep the data path only.
        loc = [part for part in loc if not part.startswith(("function-", "lax-", "json-"))]
        key = ".".join(loc)
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        elif err["type"] == "missing":
            message = "required key is missing"
        elif err["type"] == "literal_error":
            message = f"must be one of {err['ctx']['expected']} (got {err['input']!r})"
        else:
            message = err["msg"]
            if "input" in err and not isinstance(err["input"], dict | list):
                message += f" (got {err['input']!r})"
        errors.append(InventoryError(source, key, message, _line_of(lines, key)))
    return errors
