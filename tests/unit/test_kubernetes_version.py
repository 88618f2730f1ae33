"""The typed Kubernetes version: both spellings parse, each consumer's spelling comes out."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app
from inventory.versions import KubernetesVersion


@pytest.mark.parametrize("text", ["1.36.3", "v1.36.3"])
def test_both_spellings_give_the_same_version(text):
    version = KubernetesVersion.parse(text)
    assert version == KubernetesVersion(1, 36, 3)
    assert (version.tag, version.plain, version.major_minor) == ("v1.36.3", "1.36.3", "1.36")
    assert str(version) == "1.36.3"


def test_versions_order_by_number_not_by_text():
    versions = [KubernetesVersion.parse(t) for t in ("1.36.0", "1.35.10", "v1.35.9", "2.0.0")]
    assert [v.plain for v in sorted(versions)] == ["1.35.9", "1.35.10", "1.36.0", "2.0.0"]


@pytest.mark.parametrize("text", ["1.36", "1.36.3.1", "V1.36.3", "1.36.x", " 1.36.3", ""])
def test_anything_else_is_a_value_error_naming_the_text(text):
    with pytest.raises(ValueError, match=r"is not a Kubernetes version: expected MAJOR\.MINOR"):
        KubernetesVersion.parse(text)


def test_the_inventory_keeps_its_spelling_and_gives_the_typed_version():
    from inventory.model import Versions

    versions = Versions(kubernetes="v1.36.3")
    assert versions.kubernetes == "v1.36.3"
    assert versions.kubernetes_version == KubernetesVersion(1, 36, 3)


def test_an_inventory_with_a_bad_version_fails_validation(small_cluster, write_cluster):
    small_cluster["versions"] = {**small_cluster.get("versions", {}), "kubernetes": "1.36"}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "versions.kubernetes: " in result.stderr
    assert "'1.36' is not a Kubernetes version" in result.stderr
