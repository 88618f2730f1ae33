"""Offline validation of rendered Kubernetes files: objects the API server serves against the
official OpenAPI schemas of the pinned version (kubernetes-validate, strict: unknown fields
fail), and the documents those schemas do not hold (kubeadm, kubelet and kube-proxy
configuration, the audit policy, Calico's custom resources) against this role's typed models."""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from inventory.versions import KubernetesVersion
from roles.kubernetes.models import MODELS


@dataclass(frozen=True)
class Problem:
    source: str  # file name
    document: int  # 1-based position in the file
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: document {self.document} ({self.kind}): {self.message}"


def schema_version(kubernetes: str) -> str:
    """kubernetes-validate holds one schema set per minor ("1.31.0")."""
    return f"{KubernetesVersion.parse(kubernetes).major_minor}.0"


def validate_text(text: str, source: str, kubernetes: str) -> list[Problem]:
    import kubernetes_validate  # only needed here: loading its schemas takes a moment

    problems: list[Problem] = []
    for position, document in enumerate(yaml.safe_load_all(text), 1):
        if document is None:
            continue
        api, kind = document.get("apiVersion", "?"), document.get("kind", "?")
        model = MODELS.get((api, kind))
        try:
            if model is not None:
                model.model_validate(document)
            else:
                kubernetes_validate.validate(document, schema_version(kubernetes), strict=True)
        except ValidationError as exc:
            problems.append(Problem(source, position, kind, str(exc).splitlines()[0]))
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(Problem(source, position, kind, f"no schema for {api} {kind}"))
        except kubernetes_validate.ValidationError as exc:
            problems.append(Problem(source, position, kind, exc.message))
    return problems
